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
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from neuronx_distributed_inference.modules.generation.sampling import sample

MAGIC = b"FAKE-NXDI-TRACED-MODEL\n"
KV_CACHE_PAD_FOR_SEQ_IDS_MASKING = 128
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
        lines = self.spec["kv_cache_batch_size"]
        length = self.spec["max_length"] + (KV_CACHE_PAD_FOR_SEQ_IDS_MASKING if self.spec["apply_seq_ids_mask"] else 0)
        self.kv_tokens = torch.full((lines, length), -1, dtype=torch.long)
        self.kv_positions = torch.full((lines, length), -1, dtype=torch.long)
        self.generator = torch.Generator().manual_seed(0)

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
        entry: dict[str, Any] = {
            "tag": tag,
            "bucket": self.spec["programs"][tag][rank]["bucket"],
            "batch_size": int(input_ids.shape[0]),
            "seq_ids": seq_ids.tolist(),
        }
        if input_ids.shape[-1] > 1:
            out, entry["writes"] = self._context(input_ids, position_ids, seq_ids, sampling_params)
        else:
            out, entry["writes"] = self._token_generation(
                input_ids, attention_mask, position_ids, seq_ids, sampling_params
            )
        self.trace_log.append(entry)
        return out

    # -- programs -------------------------------------------------------------------------
    def _context(self, input_ids: torch.Tensor, position_ids: torch.Tensor, seq_ids: torch.Tensor,
                 sampling_params: torch.Tensor) -> Any:  # fmt: skip
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
            logits.append(self._logits(tokens[: index + 1].tolist(), positions[: index + 1].tolist()))
            self.kv_tokens[line, :bucket] = tokens
            self.kv_positions[line, :bucket] = positions
            writes.append([line % self.kv_tokens.shape[0], 0, bucket])  # [KV line, first position, count]
        return self._head(torch.stack(logits), sampling_params), writes

    def _token_generation(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                          seq_ids: torch.Tensor, sampling_params: torch.Tensor) -> Any:  # fmt: skip
        assert self.kv_tokens is not None and self.kv_positions is not None
        rows = input_ids.shape[0]
        logits = []
        for line in range(rows):  # row i is KV line i
            width = attention_mask.shape[1]
            attended = (attention_mask[line].long() == 1) & (self.kv_tokens[line, :width] >= 0)
            tokens = self.kv_tokens[line, :width][attended].tolist() + [int(input_ids[line, 0])]
            positions = self.kv_positions[line, :width][attended].tolist() + [int(position_ids[line, 0])]
            logits.append(self._logits(tokens, positions))
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

    def _logits(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        assert self.hf_model is not None
        with torch.inference_mode():
            out = self.hf_model(input_ids=torch.tensor([tokens]), position_ids=torch.tensor([positions])).logits
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
