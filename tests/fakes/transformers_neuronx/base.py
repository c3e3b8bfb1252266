"""Mirrors the public API of NeuronModelBase (src/transformers_neuronx/base.py) and
PretrainedModel.from_pretrained (src/transformers_neuronx/module.py), on CPU.

What is faithful, because the backend depends on it:
- `from_pretrained(path, **kwargs)` runs the real `_sanity_check` (AssertionError: a
  context_length_estimate above n_positions; a BSH cache_layout without continuous
  batching; continuous batching whose batch_size_for_shared_caches is not batch_size),
  reads config.json and loads weights from model.safetensors, its index, a
  `pytorch_model.bin/` split folder or pytorch_model.bin, else FileNotFoundError.
- `amp` other than f32/f16/bf16/s8/f8e4m3fn raises KeyError (so 'fp16' does).
- Programs: one per token bucket (powers of two from 128 to n_positions) and one per
  context bucket (default: half of each token bucket), each for the compiled batch size;
  a NEFF is named by a hash of what its HLO depends on (class, model shape, tp_degree,
  amp, bucket, batch size, NeuronConfig), not by the compiler flags.
- `load(dir)` only records the folder; `to_neuron()` then needs a NEFF for every program
  there, else FileNotFoundError, and does not compile. Without load(), to_neuron compiles
  (see compiler.py for NEFF reuse). `save(dir)` before a successful to_neuron() fails.
- `forward(input_ids, cache_ids, start_ids)` returns [batch, vocab] float32 logits of the
  last position; a batch size that was not compiled raises KeyError; a position at or
  beyond n_positions raises StopIteration.
- 2-D cache ids (NeuronConfig.lhs_aligned: right-padded rows, `start_ids` = slot ids): each
  token is written at its own cache id, every written position is attended, at its cache id
  as position, and each row's logits come from its largest cache id. Rows that were
  left-padded therefore come out wrong, as on a device.
- A NEURON_RT_VISIBLE_CORES range smaller than tp_degree fails to_neuron() (the runtime
  cannot place the model).

The fake runs the Hugging Face model underneath in float32 whatever `amp` says, and
recomputes the whole sequence each step instead of keeping a KV cache.
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
        self._hf_model: torch.nn.Module | None = None
        self._neffs: dict[str, bytes] | None = None
        self._history: torch.Tensor | None = None
        self._slots: torch.Tensor | None = None  # 2-D cache ids: the token at each [row, cache id], -1 if none
        self._decode_steps = 0

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
        specs += [("context", b, n) for b in self.context_buckets for n in self.batch_sizes]
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

    # -- inference -------------------------------------------------------------------
    def reset(self) -> None:
        self._history = None

    def forward(
        self,
        input_ids: torch.Tensor,
        cache_ids: torch.Tensor | None = None,
        start_ids: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self._neffs is None or self._hf_model is None:
            raise RuntimeError("the model is not on Neuron: call to_neuron() first")
        batch, length = input_ids.shape
        if cache_ids is not None and cache_ids.dim() == 2:
            return self._forward_2d(input_ids, cache_ids)
        if cache_ids is None:
            cache_ids = torch.arange(length, dtype=torch.int32)
        if int(cache_ids.max()) >= self.n_positions:
            raise StopIteration(f"position {int(cache_ids.max())} is beyond n_positions {self.n_positions}")
        if length > 1:
            bucket = find_bucket(self.context_buckets, length)
            if batch not in self.batch_sizes:
                raise KeyError((bucket, batch))
            self._history = input_ids.clone()
            self._decode_steps = 0
            _calllog.record("context", bucket=bucket, batch_size=batch, length=length)
        else:
            if batch not in self.batch_sizes:
                raise KeyError(batch)
            self._decode_steps += 1
            _hold.maybe_hold(self._decode_steps)
            position = int(cache_ids.reshape(-1)[0])
            history = self._history if self._history is not None else input_ids[:, :0]
            self._history = torch.cat([history[:, :position], input_ids], dim=1)
        start = torch.zeros(batch, dtype=torch.long) if start_ids is None else start_ids.to(torch.long).reshape(-1)
        ids = self._history
        steps = torch.arange(ids.shape[1])[None, :]
        mask = (steps >= start[:, None]).long()
        positions = (steps - start[:, None]).clamp(min=0)
        with torch.inference_mode():
            logits = self._hf_model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
        return logits[:, -1, :].float()

    def _forward_2d(self, input_ids: torch.Tensor, cache_ids: torch.Tensor) -> torch.Tensor:
        batch, length = input_ids.shape
        if batch not in self.batch_sizes:
            raise KeyError(batch)
        if int(cache_ids.max()) >= self.n_positions:
            raise StopIteration(f"position {int(cache_ids.max())} is beyond n_positions {self.n_positions}")
        if length > 1 or self._slots is None:
            self._slots = torch.full((batch, self.n_positions), -1, dtype=torch.long)
            bucket = find_bucket(self.context_buckets, length)
            _calllog.record("context", bucket=bucket, batch_size=batch, length=length)
        rows = torch.arange(batch)[:, None].expand(batch, length)
        self._slots[rows, cache_ids.long()] = input_ids.long()
        last = cache_ids.long().max(dim=1).values
        ids = self._slots[:, : int(last.max()) + 1]
        positions = torch.arange(ids.shape[1])[None, :].expand_as(ids)
        with torch.inference_mode():
            logits = self._hf_model(
                input_ids=ids.clamp(min=0), attention_mask=(ids >= 0).long(), position_ids=positions
            ).logits
        return logits[torch.arange(batch), last, :].float()


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
