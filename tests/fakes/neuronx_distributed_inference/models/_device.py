"""The fake's stand-in for the compiled model (model.pt, a TorchScript NxDModel holding every
context-encoding and token-generation bucket) and for what runs it on the NeuronCores. Not a
mirror of one file: it re-implements, on the tiny Hugging Face model on CPU, what these
parts of NxD Inference 0.8.16251 / NxD 0.17 (SDK 2.28) do on the device:

- neuronx_distributed/trace/spmd.py `router`: a call goes to the program whose traced input
  shapes equal the call's (all seven inputs: input_ids, attention_mask, position_ids,
  seq_ids, sampling_params and the two dummies); otherwise
  ValueError("Input shape [...] not found in input_shape_map: ..."). So e.g. a 1-row
  prefill with a (batch_size, 3) sampling_params fails, and so do 2-D seq_ids.
- models/model_base.py NeuronBaseModel.forward + modules/kvcache/kv_cache_manager.py, for
  continuous batching with right padding:
  * context encoding (a program with more than one active token): the row's whole bucket
    (tokens and position ids, padding included) is written into KV line seq_ids[0]
    (update_cache_const_indices: positions 0..bucket-1); attention is plain causal over
    the bucket (the attention mask is not used with right padding); the hidden state and
    logits are those of index argmax(position_ids) (torch.max(...).indices: the first
    maximum). With the padding of position ids by 1, a 1-token prompt therefore yields the
    logits of index 1, the first pad token, not of the prompt token.
  * token generation (one active token): row i of the batch reads and writes KV line i
    (seq_ids are not used to place rows); it attends the cache entries where its attention
    mask is 1 plus itself; its K/V are then scattered at index position_ids[i], or, with
    apply_seq_ids_mask and seq_id -1, at index max_length (the 128 padding positions the
    KV cache gets with that flag), where nobody reads them.
- the LM head (ColumnParallelLinear(pad=True) of neuronx_distributed/parallel_layers/
  layers.py + sampling.py mask_padded_logits): the vocabulary is padded to a multiple of
  tp_degree. Without on-device sampling the head gathers its output and NxD narrows it back
  to vocab_size, then NxDI's mask_padded_logits (rank 0 of a world of 1) sets the **last
  pad_size real entries** to finfo(float32).min: logits are float32 (rows, 1, vocab_size)
  and tokens vocab_size-pad_size.. vocab_size-1 can never win. With on-device sampling the
  per-rank logits keep their padding (the pad entries are finfo.min) and, with
  output_logits, come back gathered as (rows, 1, vocab_size + pad_size).

What the fake stores in each KV position is the token id and its position id (-1: never
written); logits are recomputed by running the Hugging Face model over the entries a row
attends, in index order, with their position ids. A token written at the wrong place
therefore changes every later logit of that line, as overwritten K/V do on a device. The
model runs in float32 whatever torch_dtype says. A decode whose position is beyond the KV
cache raises IndexError here (on a device the write would be undefined).

Multi-LoRA (modules/lora_serving/, a model compiled with a lora_config): the device holds each LoRA
module's (max_loras, ...) weight stacks and one "active" copy per row of LoraServingConfig.batch_size
(lora_layer.py, lora_model.py `update_lora_tensors`), and really applies them: each targeted
projection of the Hugging Face model adds x @ lora_A @ lora_B (lora_A already scaled by alpha / r).
- context encoding (lora_model.py:234-243, lora_layer.py:47-55): the row's adapter index
  (`adapter_ids`, the program's seventh input) picks a slot of the stacks (index_select), whose
  weights are copied into the active row of the row's seq_id (DynamicUpdateSlice: a seq_id beyond the
  active rows is clamped to the last one, XLA's documented semantics, kvcache/utils.py:57-62 links
  them); the row runs with that active row (get_weight, lora_layer.py:57-63). An index outside
  0..max_loras-1 raises IndexError here (what a device gather does with it is not documented; torch
  on CPU raises): an invention of the fake, so a test sees it.
- token generation (lora_model.py:232-233): the active rows as they are, row i of the batch with
  active row i (with batch_size 1, every row with active row 0: the einsum broadcasts); the call's
  adapter_ids are not read. A slot keeps the adapter of its context encoding.
Each program entry of the trace log then carries `lora`: per row [active row, the label of the
adapter it ran with] (the label: the adapter index whose weights were copied into that slot of the
stacks, kept by `lora_slot_labels`; dynamic swaps update it).

Fused EAGLE speculation (a model.pt with `fused_speculation`; NxDI's NeuronFusedSpecModel,
model_base.py:1641-3063). The weights arrive as `target_model.*` (the Hugging Face model above) and
`draft_model.*` (kept aside: the draft must hold `lm_head.weight`, the SDK guide's "EAGLE Checkpoint
Compatibility" requirement, else RuntimeError at initialize, an invention of the fake where the real
one's failure is not documented; `draft_fingerprint` is a digest of them, so a test sees which draft
the device holds).
- context encoding (`_eagle_context_encoding_forward` + `_cte_postprocessor`, 2075-2134, 2798-2839): as
  above for the target, and the program returns [the token padded with -1 to (rows, speculation_length),
  that token (rows, 1), the next attention mask (rows, max_length), the next position (rows, 1) = the
  attention mask's sum]. (The draft's cache and the hidden-state buffer are not modelled.)
- token generation (`_eagle_token_gen_forward` + `_tkg_postprocessor`, 2559-2796, 2841-2897), row i =
  KV line i: the positions are first clamped to [0, bucket - speculation_length] (2959-2962); the
  draft proposes speculation_length - 1 tokens one after another (2594); the target runs over the row's
  attended cache, its input token and the drafts, at positions p .. p + speculation_length - 1, and
  picks a token at each (the sampler above, per row); the row accepts the drafts up to the first that
  differs from the target's pick before it, plus the target's pick after them: n = 1 .. speculation_length
  (2857-2861). The target's K/V are written for all speculation_length candidate positions; the next
  call's attention mask hides those beyond the accepted ones. Output: [accepted (rows,
  speculation_length) int32, the target's picks up to n then -1 (2863-2873); the last accepted token
  (rows, 1) (2888-2895); the next attention mask (rows, bucket) (2877-2885); the next position p + n
  (rows, 1) (2875)].
  With do_sample the real target accepts with speculative sampling against the greedy draft
  (2685-2766); for a one-hot draft that is the same distribution as "draw the target's token, accept
  the draft if they are equal", which is what the fake does (with the device's generator).
- The fake's draft (an invention; NxDI's draft is a trained network): at each step it proposes the
  target's greedy token for the position it drafts, except at positions q with q % miss_period == 0,
  where it proposes that token + 1 (mod the vocabulary). miss_period is the draft config.json's
  `fake_eagle_miss_period` compiled in (default 3; 0: it never misses). So a row's accepted count
  depends on its position, and rows of one call accept different counts.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from neuronx_distributed_inference.modules.generation.sampling import sample

MAGIC = b"FAKE-NXDI-TRACED-MODEL\n"
KV_CACHE_PAD_FOR_SEQ_IDS_MASKING = 128
DEFAULT_MISS_PERIOD = 3  # the fake EAGLE draft's (module docstring)
FUSED_SPECULATION_MODEL_TAG = "fused_speculation_model"
ACCEPTANCE_PADDING = -1  # model_base.py:1692
_VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])
FLOAT32 = {"dtype" if _VERSION >= (4, 56) else "torch_dtype": torch.float32}


def padding_length(numerator: int, denominator: int) -> int:
    """neuronx_distributed.parallel_layers.utils.get_padding_length."""
    return (denominator - numerator % denominator) % denominator


def visible_core_count(value: str) -> int:
    count = 0
    for part in value.split(","):
        first, _, last = part.strip().partition("-")
        count += int(last or first) - int(first) + 1
    return count


class TracedModel:
    """model.pt: the programs and what was traced into them, plus (after initialize()) the weights
    and the KV cache."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.input_shape_map: dict[str, tuple[str, int]] = {}
        for tag, programs in spec["programs"].items():
            for rank, program in enumerate(programs):
                self.input_shape_map[str(program["input_shapes"])] = (tag, rank)
        self.hf_model: torch.nn.Module | None = None
        self.kv_tokens: torch.Tensor | None = None
        self.kv_positions: torch.Tensor | None = None
        self.generator = torch.Generator().manual_seed(0)
        self.trace_log: list[dict[str, Any]] = []  # the programs run since the last clear (for the call log)
        self.lora = spec.get("lora")  # None: compiled without LoRA
        self.fused = spec.get("fused_speculation")  # None: compiled without fused speculation
        self.draft_fingerprint: str | None = None  # the draft weights initialize() got (fused speculation)
        self.lora_stacks: dict[str, list[torch.Tensor]] = {}  # module -> [lora_A (max_loras, in, r), lora_B]
        self.lora_slot_labels: list[int | None] = []  # what each slot of the stacks holds (adapter index)
        self.lora_active: list[tuple[int | None, dict[str, tuple[torch.Tensor, torch.Tensor]]]] = []
        self._lora_now: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # the row being run

    # -- model.pt -------------------------------------------------------------------------
    def save(self, path: str) -> None:
        with open(path, "wb") as handle:
            handle.write(MAGIC + json.dumps(self.spec, sort_keys=True, indent=1).encode())

    @classmethod
    def load(cls, path: str) -> TracedModel:
        if not os.path.exists(path):
            raise ValueError(f"The provided filename {path} does not exist")  # what torch.jit.load says
        with open(path, "rb") as handle:
            data = handle.read()
        if not data.startswith(MAGIC):
            raise RuntimeError(
                "PytorchStreamReader failed reading zip archive: not a ZIP archive (not a model.pt written by the fake)"
            )
        return cls(json.loads(data[len(MAGIC) :]))

    # -- runtime ------------------------------------------------------------------------------
    def initialize(self, state_dict: dict[str, torch.Tensor]) -> None:
        """NxDModel.initialize(weights, start_rank): needs one NeuronCore per rank."""
        visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
        needed = self.spec["world_size"]
        if visible and visible_core_count(visible) < needed:
            raise RuntimeError(
                f"fake Neuron runtime: NEURON_RT_VISIBLE_CORES={visible} gives fewer NeuronCores than the "
                f"{needed} ranks (tp_degree) the model was compiled for"
            )
        hf = dict(self.spec["hf_config"])
        config = AutoConfig.for_model(hf.pop("model_type"), **hf)
        model = AutoModelForCausalLM.from_config(config, **FLOAT32)
        if self.fused is not None:
            state_dict = self._initialize_draft(state_dict)
        lora_weights = {k: v for k, v in state_dict.items() if ".lora_A." in k or ".lora_B." in k}
        state_dict = {k: v for k, v in state_dict.items() if k not in lora_weights}
        weights = {("model." + k if not k.startswith("lm_head.") else k): v for k, v in state_dict.items()}
        missing, unexpected = model.load_state_dict(weights, strict=False)
        missing = [name for name in missing if not (name == "lm_head.weight" and config.tie_word_embeddings)]
        if missing or unexpected:
            raise RuntimeError(
                f"fake NxD: the checkpoint does not fit the compiled model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )
        if config.tie_word_embeddings:
            model.tie_weights()
        self.hf_model = model.float().eval()
        self._initialize_lora(lora_weights)
        lines = self.spec["kv_cache_batch_size"]
        length = self.spec["max_length"] + (KV_CACHE_PAD_FOR_SEQ_IDS_MASKING if self.spec["apply_seq_ids_mask"] else 0)
        self.kv_tokens = torch.full((lines, length), -1, dtype=torch.long)
        self.kv_positions = torch.full((lines, length), -1, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(0)

    def _initialize_draft(self, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The draft's weights set aside (their digest kept), the target's returned without their prefix."""
        draft = {k[len("draft_model.") :]: v for k, v in state_dict.items() if k.startswith("draft_model.")}
        target = {k[len("target_model.") :]: v for k, v in state_dict.items() if k.startswith("target_model.")}
        if "lm_head.weight" not in draft:
            raise RuntimeError(
                "fake NxD: the EAGLE draft's weights have no lm_head.weight (NxDI needs the target's LM head copied "
                "into the draft)"
            )
        digest = hashlib.sha256()
        for name in sorted(draft):
            digest.update(name.encode())
            digest.update(draft[name].float().contiguous().numpy().tobytes())
        self.draft_fingerprint = digest.hexdigest()[:16]
        return target

    def _initialize_lora(self, weights: dict[str, torch.Tensor]) -> None:
        """The LoRA stacks from the state dict, a hook on each targeted projection of the HF model."""
        if self.lora is None:
            if weights:
                raise RuntimeError(f"fake NxD: LoRA weights {sorted(weights)[:3]} for a model compiled without LoRA")
            return
        assert self.hf_model is not None
        for module in self.lora["modules"]:
            stacks = [weights.get(f"{module}.lora_A.weight"), weights.get(f"{module}.lora_B.weight")]
            if stacks[0] is None or stacks[1] is None:
                raise RuntimeError(f"fake NxD: the checkpoint has no LoRA weights for {module} (missing)")
            self.lora_stacks[module] = [stack.float().clone() for stack in stacks]
            self.hf_model.get_submodule(f"model.{module}").register_forward_hook(self._lora_hook(module))
        self.lora_slot_labels = list(self.lora["device_adapters"]) + [None] * (
            self.lora["max_loras"] - len(self.lora["device_adapters"])
        )
        self.lora_active = [(None, {}) for _ in range(self.lora["batch_size"])]  # zeros until a prefill

    def _lora_hook(self, module: str) -> Any:
        def hook(_: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> torch.Tensor:
            weights = self._lora_now.get(module)
            return output if weights is None else output + (inputs[0] @ weights[0]) @ weights[1]

        return hook

    def lora_device_weights(self) -> list[dict[str, torch.Tensor]]:
        """The device's LoRA stacks as NxD's `nxd_model.weights` presents them to a dynamic swap
        (a list per rank of name -> tensor, written in place); the fake holds one copy for every rank."""
        names = {}
        for module, (a, b) in self.lora_stacks.items():
            names[f"{module}.lora_A.weight"], names[f"{module}.lora_B.weight"] = a, b
        return [names]

    def _lora_into_active(self, index: int, seq_id: int) -> int:
        """A context-encoding row: stack slot `index` copied into the active row of `seq_id` (clamped)."""
        max_loras = self.lora["max_loras"]
        if not 0 <= index < max_loras:
            raise IndexError(
                f"fake NxD: adapter index {index} is outside the {max_loras} LoRA slots (max_loras) "
                "compiled into the model"
            )
        row = min(max(seq_id, 0), len(self.lora_active) - 1)
        copies = {module: (a[index].clone(), b[index].clone()) for module, (a, b) in self.lora_stacks.items()}
        self.lora_active[row] = (self.lora_slot_labels[index], copies)
        return row

    def _active_row(self, row: int) -> int:
        return row if len(self.lora_active) > 1 else 0

    def router(self, inputs: list[torch.Tensor]) -> tuple[str, int]:
        actual_shape = str([list(tensor.shape) for tensor in inputs])
        if actual_shape not in self.input_shape_map:
            raise ValueError(f"Input shape {actual_shape} not found in input_shape_map: {list(self.input_shape_map)}")
        return self.input_shape_map[actual_shape]

    def __call__(self, *inputs: torch.Tensor) -> Any:
        if self.hf_model is None:
            raise RuntimeError("fake NxD: the model's weights were never initialized (load() did not finish)")
        tag, rank = self.router(list(inputs))
        input_ids, attention_mask, position_ids, seq_ids, sampling_params = inputs[:5]
        adapter_ids = inputs[6] if len(inputs) > 6 else None
        entry: dict[str, Any] = {
            "tag": tag,
            "bucket": self.spec["programs"][tag][rank]["bucket"],
            "batch_size": int(input_ids.shape[0]),
            "seq_ids": seq_ids.tolist(),
        }
        if self.lora is not None:
            entry["lora"] = []
        if tag == FUSED_SPECULATION_MODEL_TAG:
            out, entry["writes"] = self._fused_token_generation(
                input_ids, attention_mask, position_ids, sampling_params, entry
            )
        elif input_ids.shape[-1] > 1:
            out, entry["writes"] = self._context(input_ids, position_ids, seq_ids, sampling_params, adapter_ids, entry)
            if self.fused is not None:
                out = self._fused_context_outputs(out, attention_mask)
        else:
            out, entry["writes"] = self._token_generation(
                input_ids, attention_mask, position_ids, seq_ids, sampling_params, entry
            )
        self.trace_log.append(entry)
        return out

    # -- programs -------------------------------------------------------------------------
    def _context(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        sampling_params: torch.Tensor,
        adapter_ids: torch.Tensor | None,
        entry: dict[str, Any],
    ) -> Any:
        assert self.kv_tokens is not None and self.kv_positions is not None
        writes = []
        logits = []
        for row in range(input_ids.shape[0]):
            line = int(seq_ids[row])
            if not -self.kv_tokens.shape[0] <= line < self.kv_tokens.shape[0]:
                raise IndexError(f"fake NxD: seq_id {line} is outside the KV cache's {self.kv_tokens.shape[0]} lines")
            tokens = input_ids[row].long()
            positions = position_ids[row].long()
            bucket = tokens.shape[0]
            index = int(torch.max(positions, dim=0).indices)
            lora = None
            if self.lora is not None:
                assert adapter_ids is not None
                active = self._lora_into_active(int(adapter_ids[row]), line)
                lora = self.lora_active[active][1]
                entry["lora"].append([active, self.lora_active[active][0]])
            logits.append(self._logits(tokens[: index + 1].tolist(), positions[: index + 1].tolist(), lora))
            self.kv_tokens[line, :bucket] = tokens
            self.kv_positions[line, :bucket] = positions
            writes.append([line % self.kv_tokens.shape[0], 0, bucket])  # [KV line, first position, count]
        return self._head(torch.stack(logits), sampling_params), writes

    def _token_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        sampling_params: torch.Tensor,
        entry: dict[str, Any],
    ) -> Any:
        assert self.kv_tokens is not None and self.kv_positions is not None
        rows = input_ids.shape[0]
        logits = []
        for line in range(rows):  # row i is KV line i
            width = attention_mask.shape[1]
            attended = (attention_mask[line].long() == 1) & (self.kv_tokens[line, :width] >= 0)
            tokens = self.kv_tokens[line, :width][attended].tolist() + [int(input_ids[line, 0])]
            positions = self.kv_positions[line, :width][attended].tolist() + [int(position_ids[line, 0])]
            lora = None
            if self.lora is not None:
                active = self._active_row(line)
                lora = self.lora_active[active][1]
                entry["lora"].append([active, self.lora_active[active][0]])
            logits.append(self._logits(tokens, positions, lora))
        writes = []
        for line in range(rows):
            index = int(position_ids[line, 0])
            if self.spec["apply_seq_ids_mask"] and int(seq_ids[line]) < 0:
                index = self.spec["max_length"]  # apply_seq_id_mask: the write goes to the padding positions
            if index >= self.kv_tokens.shape[1]:
                raise IndexError(
                    f"fake NxD: decode position {index} is outside the KV cache ({self.kv_tokens.shape[1]} positions); "
                    "on a device this write is undefined"
                )
            self.kv_tokens[line, index] = int(input_ids[line, 0])
            self.kv_positions[line, index] = int(position_ids[line, 0])
            writes.append([line, index, 1])
        return self._head(torch.stack(logits), sampling_params), writes

    def _fused_context_outputs(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> list[torch.Tensor]:
        """`_cte_postprocessor` (model_base.py:2798-2839) over the context program's tokens."""
        assert self.fused is not None
        rows, length = tokens.shape[0], self.fused["speculation_length"]
        padded = torch.full((rows, length), ACCEPTANCE_PADDING, dtype=torch.int32)
        padded[:, 0] = tokens.reshape(-1).to(torch.int32)
        next_positions = attention_mask.sum(dim=1).to(torch.int32).reshape(rows, 1)
        return [padded, padded[:, :1].clone(), self._next_mask(next_positions, self.spec["max_length"]), next_positions]

    @staticmethod
    def _next_mask(next_positions: torch.Tensor, width: int) -> torch.Tensor:
        """The attention mask of the positions before each row's next one (model_base.py:2877-2885)."""
        return (torch.arange(width).view(1, -1) <= next_positions - 1).to(torch.int32)

    def _fused_token_generation(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        sampling_params: torch.Tensor,
        entry: dict[str, Any],
    ) -> Any:
        """One fused EAGLE step (module docstring), row i on KV line i."""
        assert self.kv_tokens is not None and self.kv_positions is not None and self.fused is not None
        length, period = self.fused["speculation_length"], self.fused["miss_period"]
        bucket = attention_mask.shape[1]
        positions = torch.clamp(position_ids.reshape(-1).long(), min=0, max=bucket - length)  # model_base.py:2962
        rows = input_ids.shape[0]
        accepted = torch.full((rows, length), ACCEPTANCE_PADDING, dtype=torch.int32)
        next_positions = torch.zeros((rows, 1), dtype=torch.int32)
        entry["accepted"], writes = [], []
        for line in range(rows):
            attended = (attention_mask[line].long() == 1) & (self.kv_tokens[line, :bucket] >= 0)
            history = self.kv_tokens[line, :bucket][attended].tolist()
            history_positions = self.kv_positions[line, :bucket][attended].tolist()
            start = int(positions[line])
            candidates, logits = [int(input_ids[line, 0])], []
            for j in range(length):  # the target's logits after each candidate; the draft's next from them
                span = list(range(start, start + j + 1))
                logits.append(self._logits(history + candidates, history_positions + span))
                if j < length - 1:
                    greedy = int(torch.argmax(logits[-1]))
                    missed = period > 0 and (start + j + 1) % period == 0
                    candidates.append((greedy + 1) % logits[-1].shape[-1] if missed else greedy)
            picks = self._head(torch.stack(logits), sampling_params[line : line + 1].repeat(length, 1))
            picks = [int(token) for token in picks.reshape(-1).tolist()]
            count = 1
            while count < length and candidates[count] == picks[count - 1]:
                count += 1
            accepted[line, :count] = torch.tensor(picks[:count], dtype=torch.int32)
            next_positions[line, 0] = start + count
            if start + length > self.kv_tokens.shape[1]:
                raise IndexError(f"fake NxD: positions {start}..{start + length - 1} are outside the KV cache")
            self.kv_tokens[line, start : start + length] = torch.tensor(candidates)
            self.kv_positions[line, start : start + length] = torch.arange(start, start + length)
            writes.append([line, start, length])
            entry["accepted"].append(count)
        next_input_ids = accepted.gather(1, (next_positions.long() - positions.view(-1, 1).long()) - 1)
        return [accepted, next_input_ids, self._next_mask(next_positions, bucket), next_positions], writes

    def _logits(
        self, tokens: list[int], positions: list[int], lora: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None
    ) -> torch.Tensor:
        assert self.hf_model is not None
        self._lora_now = lora or {}
        try:
            with torch.inference_mode():
                out = self.hf_model(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions])).logits
        finally:
            self._lora_now = {}
        return out[0, -1, :].float()

    def _head(self, logits: torch.Tensor, sampling_params: torch.Tensor) -> Any:
        """(rows, vocab) float32 -> what the program returns (see the module docstring)."""
        vocab = logits.shape[-1]
        pad = padding_length(vocab, self.spec["tp_degree"])
        minimum = torch.finfo(torch.float32).min
        sampling = self.spec["on_device_sampling"]
        if sampling is None:
            masked = logits.clone()
            if pad:
                masked[:, vocab - pad :] = minimum  # mask_padded_logits on the already narrowed output
            return masked.unsqueeze(1)
        padded = torch.cat([logits, torch.full((logits.shape[0], pad), minimum)], dim=1)
        tokens = sample(padded, sampling_params, sampling, self.generator)
        if self.spec["output_logits"]:
            return [tokens, padded.unsqueeze(1)]
        return tokens
