"""Mirrors the public API of NeuronModelBase (src/transformers_neuronx/base.py) and
PretrainedModel.from_pretrained (src/transformers_neuronx/module.py), on CPU.

What is faithful, because the backend depends on it:
- `from_pretrained(path, **kwargs)` runs the real `_sanity_check` (AssertionError: a
  context_length_estimate above n_positions; a BSH cache_layout without continuous
  batching, or with it but without one-bucket lists; continuous batching whose
  batch_size_for_shared_caches (= max_num_seqs) is not batch_size), reads config.json and
  loads weights from model.safetensors, its index, a `pytorch_model.bin/` split folder or
  pytorch_model.bin, else FileNotFoundError.
- `amp` other than f32/f16/bf16/s8/f8e4m3fn raises KeyError (so 'fp16' does).
- Programs: one per token bucket (powers of two from 128 to n_positions) for the compiled
  batch size, and one per context bucket (default: half of each token bucket) for batch 1
  under continuous batching (llama/model.py: `context_batch_sizes`); a NEFF is named by a
  hash of what its HLO depends on (class, model shape, tp_degree, amp, bucket, batch size,
  NeuronConfig including its ContinuousBatchingConfig), not by the compiler flags.
- `load(dir)` only records the folder; `to_neuron()` then needs a NEFF for every program
  there, else FileNotFoundError, and does not compile. Without load(), to_neuron compiles
  (see compiler.py for NEFF reuse). `save(dir)` before a successful to_neuron() fails.
- `forward(input_ids, cache_ids, start_ids)` under continuous batching, as base.py's
  `_prepare_for_continuous_batching`, `_prepare_for_par_ctx_rhs_padding`, `_forward` and
  `_postprocess` route it. The KV cache has one line per sequence slot (`start_ids`):
  * context encoding when T > 1 and the first cache id is 0: each row alone, in the
    smallest context bucket >= T (T above the largest: AssertionError "invalid input prompt
    length"); its tokens, right-padded with 0, fill positions 0..bucket-1 of its line (the
    caller's cache ids are replaced by arange(bucket), unless T fills the bucket exactly:
    then they are kept, and a repeated cache id is written twice, the last token winning);
    its logits come from its largest cache id (`last_token_id`), computed from the row;
  * token generation when T == 1 (a 1-token prompt at cache id 0 too): the full
    [max_num_seqs, 1] batch runs; each given row writes its token at its cache id, and every
    line left out of the call gets token 0 at cache id 0, overwriting position 0 of that
    line (the TRAP in shared/pitfalls.md); a cache id >= n_positions raises StopIteration;
    input_ids and cache_ids must share a dtype (the real one scatters one into a tensor of
    the other's); logits return for the given rows, in input order.
  Anything else (no continuous batching, 1-D cache ids, speculative forward) raises
  NotImplementedError: the fake models only what the backend sends.
- A NEURON_RT_VISIBLE_CORES range smaller than tp_degree fails to_neuron() (the runtime
  cannot place the model).

The fake runs the Hugging Face model underneath in float32 whatever `amp` says. Its "KV
cache" holds the token id at each position of each line, and logits are recomputed by
running the model over a line's positions 0..p: so a token written at a wrong position
changes every later logit of that line, as overwritten KV does on a device.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

from transformers_neuronx import _calllog, _hold, compiler
from transformers_neuronx.config import NeuronConfig
from transformers_neuronx.constants import LAYOUT_BSH

# transformers renamed `torch_dtype` to `dtype` in 4.56; the Neuron venvs have 4.4x
_VERSION = tuple(int(part) for part in transformers.__version__.split(".")[:2])
FLOAT32 = {"dtype" if _VERSION >= (4, 56) else "torch_dtype": torch.float32}
AMP_TYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "s8": torch.int8, "f8e4m3fn": None}


def token_sizes(n_positions: int | list[int]) -> list[int]:
    if isinstance(n_positions, list):
        return sorted(n_positions)
    sizes, size = [], 128
    while size < n_positions:
        sizes.append(size)
        size *= 2
    return [*sizes, n_positions]


def context_sizes(estimate: int | list[int] | None, token_buckets: list[int]) -> list[int]:
    if isinstance(estimate, list):
        return sorted(estimate)
    if isinstance(estimate, int):
        return [estimate] if estimate > 0 else []
    return [b // 2 for b in token_buckets]


def find_bucket(buckets: list[int], size: int) -> int | None:
    """Smallest bucket that fits `size`; the largest when none does."""
    if not buckets:
        return None
    return buckets[bisect.bisect_left(buckets, size, hi=len(buckets) - 1)]


def visible_core_count(value: str) -> int:
    count = 0
    for part in value.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


class NeuronModelBase(torch.nn.Module):
    def __init__(
        self,
        config: Any,
        *,
        n_positions: int | list[int] = 2048,
        batch_size: int = 1,
        amp: str = "f32",
        tp_degree: int = 2,
        context_length_estimate: int | list[int] | None = None,
        neuron_config: NeuronConfig | None = None,
    ) -> None:
        super().__init__()
        if amp not in AMP_TYPES:
            raise KeyError(amp)
        self.config = config
        self.amp = amp
        self.tp_degree = tp_degree
        self.neuron_config = neuron_config or NeuronConfig()
        self.token_buckets = token_sizes(n_positions)
        self.n_positions = self.token_buckets[-1]
        self.context_buckets = context_sizes(context_length_estimate, self.token_buckets)
        self.batch_sizes = sorted(batch_size) if isinstance(batch_size, list) else [batch_size]
        # llama/model.py: under continuous batching the context kernel is compiled for batch 1 only
        self.context_batch_sizes = [1] if self.neuron_config.continuous_batching else self.batch_sizes
        self._hf_model: torch.nn.Module | None = None
        self._neffs: dict[str, bytes] | None = None
        # The KV cache, one line per sequence slot: the token whose KV sits at each [line, cache id]
        # (-1: never written). Allocated by to_neuron(), like the device caches.
        self._lines: torch.Tensor | None = None
        self._steps: list[int] = []  # decode steps of each line since its last context encoding (the hold)

    # -- loading (module.PretrainedModel) ------------------------------------------
    @classmethod
    def from_pretrained(cls, pretrained_model_path: str | os.PathLike[str], *model_args: Any, **kwargs: Any):
        _sanity_check(**kwargs)
        n_positions = kwargs.get("n_positions", 2048)
        estimate = kwargs.get("context_length_estimate")
        config = AutoConfig.from_pretrained(pretrained_model_path)
        model = cls(config, *model_args, **kwargs)
        model._load_weights(Path(pretrained_model_path))
        _calllog.record(
            "from_pretrained",
            cls=cls.__name__,
            path=str(pretrained_model_path),
            batch_size=kwargs.get("batch_size"),
            tp_degree=kwargs.get("tp_degree"),
            amp=kwargs.get("amp"),
            n_positions=n_positions,
            context_length_estimate=estimate,
            neuron_config=model.neuron_config.describe(),
            checkpoint_format=model._checkpoint_format,
        )
        return model

    def _load_weights(self, path: Path) -> None:
        if (path / "model.safetensors").is_file() or (path / "model.safetensors.index.json").exists():
            self._checkpoint_format = "safetensors"
        elif (path / "pytorch_model.bin").is_dir():
            self._checkpoint_format = "split"
        elif (path / "pytorch_model.bin").is_file() or (path / "pytorch_model.bin.index.json").is_file():
            self._checkpoint_format = "bin"
        else:
            raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {path}")
        if self._checkpoint_format == "split":
            split = path / "pytorch_model.bin"
            names = json.loads((split / "key_to_filename.json").read_text())
            state = {key: torch.load(split / name, weights_only=True) for key, name in names.items()}
            model = AutoModelForCausalLM.from_config(self.config, **FLOAT32)
            model.load_state_dict(state, strict=False)
        else:
            model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, **FLOAT32)
        self._hf_model = model.eval()

    # -- programs and artifacts ------------------------------------------------------
    def _programs(self) -> dict[str, dict[str, Any]]:
        shape = {
            key: getattr(self.config, key, None)
            for key in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        }
        common = {
            "class": type(self).__name__,
            **shape,
            "tp_degree": self.tp_degree,
            "amp": self.amp,
            "neuron_config": self.neuron_config.describe(),
        }
        specs = [("token", b, n) for b in self.token_buckets for n in self.batch_sizes]
        specs += [("context", b, n) for b in self.context_buckets for n in self.context_batch_sizes]
        programs = {}
        for kind, bucket, batch in specs:
            spec = {**common, "kind": kind, "bucket": bucket, "batch_size": batch}
            digest = hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:20]
            programs[f"{digest}.neff"] = spec
        return programs

    def load(self, directory: str | os.PathLike[str]) -> None:
        self._compiled_artifacts_directory = str(directory)
        _calllog.record("load", directory=str(directory))

    def to_neuron(self) -> None:
        visible = os.environ.get("NEURON_RT_VISIBLE_CORES")
        if visible and visible_core_count(visible) < self.tp_degree:
            raise RuntimeError(f"NEURON_RT_VISIBLE_CORES={visible} has fewer than tp_degree={self.tp_degree} cores")
        programs = self._programs()
        sources: dict[str, int] = {}
        neffs: dict[str, bytes] = {}
        directory = getattr(self, "_compiled_artifacts_directory", None)
        if directory is not None:
            if not os.path.isdir(directory):
                raise FileNotFoundError(f"Did not find directory: {directory}.")
            for name in programs:
                try:
                    neffs[name] = (Path(directory) / name).read_bytes()
                except FileNotFoundError:
                    raise FileNotFoundError(
                        "Could not find a matching NEFF for your HLO in this directory. Ensure that the model you "
                        "are trying to load is the same type and has the same parameters as the one you saved"
                    ) from None
            sources["loaded"] = len(programs)
        else:
            for name, spec in programs.items():
                neff, source = compiler.compile_program(name, json.dumps(spec, sort_keys=True).encode())
                neffs[name] = neff
                sources[source] = sources.get(source, 0) + 1
        self._neffs = neffs
        lines = max(self.batch_sizes)
        self._lines = torch.full((lines, self.n_positions), -1, dtype=torch.long)
        self._steps = [0] * lines
        _calllog.record(
            "to_neuron",
            mode="load" if directory is not None else "compile",
            programs=len(programs),
            sources=sources,
            visible_cores=visible,
            num_cores=os.environ.get("NEURON_RT_NUM_CORES"),
            cc_flags=compiler.get_compiler_flags(),
            cache_url=compiler.CacheUrl.get_cache_url(),
            dump_to=os.environ.get("NEURONX_DUMP_TO"),
        )

    def save(self, directory: str | os.PathLike[str]) -> None:
        assert self._neffs is not None, "cannot save a model which has not been successfully compiled"
        if os.path.isfile(directory):
            raise FileExistsError(f"Artifacts should be saved to a directory. Found existing file: {directory}")
        os.makedirs(directory, exist_ok=True)
        for name, neff in self._neffs.items():
            (Path(directory) / name).write_bytes(neff)
        _calllog.record("save", directory=str(directory), files=len(self._neffs))

    # -- inference (continuous batching) --------------------------------------------
    def forward(
        self,
        input_ids: torch.Tensor,
        cache_ids: torch.Tensor | None = None,
        start_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """NeuronModelBase._preprocess -> _forward -> _postprocess under continuous batching:
        a context encoding when T > 1 and the first cache id is 0, else token generation."""
        if self._neffs is None or self._hf_model is None or self._lines is None:
            raise RuntimeError("the model is not on Neuron: call to_neuron() first")
        if not self.neuron_config.continuous_batching:
            raise NotImplementedError(
                "fake transformers-neuronx: only continuous batching (NeuronConfig(continuous_batching=...)) is "
                "modelled, which is what the backend builds"
            )
        if start_ids is None or cache_ids is None or cache_ids.dim() != 2:
            raise NotImplementedError(
                "fake transformers-neuronx: continuous batching is modelled with start_ids (sequence slots) and "
                "2-D cache ids, as the backend sends them"
            )
        length = input_ids.shape[1]
        if length > 1 and int(cache_ids.flatten()[0]) == 0:
            return self._context(input_ids, cache_ids, start_ids)
        if length > 1:
            raise NotImplementedError("fake transformers-neuronx: speculative forward (T > 1 from a cache id > 0)")
        return self._decode(input_ids, cache_ids, start_ids)

    def _context(self, input_ids: torch.Tensor, cache_ids: torch.Tensor, start_ids: torch.Tensor) -> torch.Tensor:
        """Each row is encoded alone (the context kernel has batch 1 under continuous batching) in the
        smallest context bucket that fits: its tokens right-padded with 0 to the bucket are written into
        line `start_ids[row]` at cache ids arange(bucket) (`_pad_cache_ids` replaces the caller's, except
        for a row that fills its bucket exactly), and its logits come from row index `last_token_id` =
        its largest cache id (the caller's, zero-padded to the bucket)."""
        rows, length = input_ids.shape
        bucket = find_bucket(self.context_buckets, length)
        assert bucket is not None and length <= bucket, f"invalid input prompt length ({length} <= {bucket})"
        assert rows == cache_ids.shape[0], f"invalid n_active_seqs ({rows} vs {cache_ids.shape[0]})"
        padded_cache_ids = torch.zeros(rows, bucket, dtype=torch.long)
        padded_cache_ids[:, :length] = cache_ids[:, :length].long()
        last_token_ids = padded_cache_ids.max(dim=1).values
        logits = []
        for row in range(rows):
            line = int(start_ids.reshape(-1)[row])
            padded = torch.zeros(bucket, dtype=torch.long)
            padded[:length] = input_ids[row].long()
            if length < bucket:
                self._lines[line, :bucket] = padded
            else:  # the caller's cache ids, in order: a repeated one keeps the last token
                for position, token in zip(padded_cache_ids[row].tolist(), padded.tolist(), strict=True):
                    self._lines[line, position] = token
            self._steps[line] = 0
            logits.append(self._context_logits(padded, int(last_token_ids[row]), self.neuron_config.output_all_logits))
        _calllog.record(
            "forward",
            kind="context",
            bucket=bucket,
            batch_size=1,
            rows=rows,
            length=length,
            start_ids=start_ids.reshape(-1).tolist(),
            last_token_ids=last_token_ids.tolist(),
        )
        return torch.stack(logits)

    def _decode(self, input_ids: torch.Tensor, cache_ids: torch.Tensor, start_ids: torch.Tensor) -> torch.Tensor:
        """Token generation always runs the full [max_num_seqs, 1] batch: the given rows are scattered
        onto their lines, every line left out gets token 0 at cache id 0 (the real padding, which
        overwrites position 0 of that line), and the logits of the given lines return in input order."""
        batch = self.neuron_config.continuous_batching.batch_size_for_shared_caches
        full_input_ids = torch.zeros(batch, 1, dtype=input_ids.dtype)
        full_cache_ids = torch.zeros(batch, 1, dtype=input_ids.dtype)  # like the real one: the dtype of input_ids
        index = start_ids.flatten().unsqueeze(-1).to(torch.int64)
        full_input_ids.scatter_(dim=0, index=index, src=input_ids)
        full_cache_ids.scatter_(dim=0, index=index, src=cache_ids)  # a cache_ids dtype unlike input_ids' fails here
        top = int(full_cache_ids.max())
        if top >= self.n_positions:
            raise StopIteration(f"position {top} is beyond n_positions {self.n_positions}")
        for line in range(batch):
            self._lines[line, int(full_cache_ids[line, 0])] = int(full_input_ids[line, 0])
        given = [int(i) for i in index.reshape(-1)]
        for line in set(given):
            self._steps[line] += 1
        _hold.maybe_hold(self._steps[line] for line in set(given))
        _calllog.record(
            "forward",
            kind="decode",
            bucket=next(b for b in self.token_buckets if b >= top + 1),
            batch_size=batch,
            rows=len(given),
            start_ids=given,
            cache_ids=cache_ids.reshape(-1).tolist(),
            padded_lines=[line for line in range(batch) if line not in given],
        )
        if self.neuron_config.output_all_logits:
            # base.py `_postprocess` returns early when output_all_logits is set and logits.shape[1] > 1, which a
            # decode's [batch, vocab] always has: every line's logits, in line order, not gathered by start_ids.
            return torch.stack([self._logits(line, int(full_cache_ids[line, 0])) for line in range(batch)])
        return torch.stack([self._logits(line, int(full_cache_ids[line, 0])) for line in given])

    def _context_logits(self, padded: torch.Tensor, last: int, all_positions: bool = False) -> torch.Tensor:
        """The logits at position `last` of a context encoding: computed from the row itself (the
        kernel attends the row's own keys under a causal mask), whatever the cache line ends up holding.
        With NeuronConfig(output_all_logits=True), those of positions 0..last ([last + 1, vocab]): base.py
        `context` keeps `logits[:, :last_token_id + 1, :]` and `_forward` permutes them to [batch, T, vocab]."""
        with torch.inference_mode():
            out = self._hf_model(input_ids=padded[None, : last + 1], position_ids=torch.arange(last + 1)[None]).logits
        return out[0].float() if all_positions else out[0, -1, :].float()

    def _logits(self, line: int, last: int) -> torch.Tensor:
        """The next-token logits at position `last` of one line: the model run over the tokens its
        cache holds at positions 0..last (never-written positions are masked out)."""
        ids = self._lines[line, : last + 1][None, :]
        with torch.inference_mode():
            out = self._hf_model(
                input_ids=ids.clamp(min=0), attention_mask=(ids >= 0).long(), position_ids=torch.arange(last + 1)[None]
            ).logits
        return out[0, -1, :].float()


def _sanity_check(**kwargs: Any) -> None:
    """module.PretrainedModel.from_pretrained's checks, same conditions and messages."""
    estimate = kwargs.get("context_length_estimate")
    n_positions = kwargs.get("n_positions", 2048)
    max_npos = max(n_positions) if isinstance(n_positions, list) else n_positions
    max_cle = max(estimate) if isinstance(estimate, list) else estimate
    if isinstance(max_npos, int) and isinstance(max_cle, int):
        assert max_npos >= max_cle, (
            f"Max context_length_estimate {max_cle} cannot be more than max n_positions {max_npos}."
        )
    neuron_config = kwargs.get("neuron_config")
    bsh_cache_layout = neuron_config is not None and neuron_config.cache_layout == LAYOUT_BSH
    continuous_batching = neuron_config and neuron_config.continuous_batching
    if continuous_batching:
        slots, expected = continuous_batching.batch_size_for_shared_caches, kwargs.get("batch_size")
        assert slots == expected, f"invalid batch_size_for_shared_caches ({slots}), {expected} is expected"
        if bsh_cache_layout and not continuous_batching.optimized_paged_attention:
            assert isinstance(n_positions, list) and len(n_positions) == 1
            assert isinstance(estimate, list) and len(estimate) == 1, (
                "BSH cache layout does not support multi-bucketing"
            )
    else:
        assert not bsh_cache_layout, "BSH cache layout can only be configured with continuous batching."
