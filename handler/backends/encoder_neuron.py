"""The `neuronx` encoder: a sentence-transformers checkpoint compiled for Inferentia2 with
`torch_neuronx.trace`, one traced module per (batch, sequence length) bucket of
`handler.embed.buckets`, on the one NeuronCore of this worker.

torch-neuronx facts this relies on (docs/embeddings.md, "Inferentia2", lists their sources):
`torch_neuronx.trace(func, example_inputs, *, compiler_workdir, compiler_args, ...)` returns a
`torch.jit.ScriptModule`, saved with `torch.jit.save` and loaded with `torch.jit.load` (which puts it
on a NeuronCore of the process); it takes only the traced input shapes and dtypes (another shape is
an error), so every call here has exactly a bucket's shape.

Start-up (handler/backends/device_backend.py, as the LLM backends): this worker takes one NeuronCore
(NEURON_RT_VISIBLE_CORES; one worker per core is the placement chosen in docs/embeddings.md), then
loads the saved modules when the manifest in <cache_dir>/artifacts matches (checkpoint content, the
buckets, amp, pooling, SDK and compiler versions, flags), else traces every bucket under the host-wide
compile lock and saves them (or refuses, with compile_on_start false).

Pooling and L2 normalisation are inside the traced graph (handler/backends/pooling.py, the hf encoder's
own functions): the device returns [batch, dimension] instead of [batch, seq, dimension] token states
(seq x less to copy back), and the host only drops the filler rows.

`encode(rows)`: each row goes to the smallest sequence bucket that holds it (right-padded, masked);
the rows of one sequence bucket run in groups of at most the largest batch bucket, each group padded
with filler rows up to the smallest batch bucket that holds it. A row longer than the largest
sequence bucket is refused (max_length is that bucket: the adapter answers 400 naming the input).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import os
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModel

from handler.backends.device_backend import DeviceBackend, compiler_version, package_version
from handler.backends.encoder_base import SentenceEncoder
from handler.backends.hf import load_model
from handler.backends.pooling import PoolingMode, l2_normalize, pool
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.neuron import artifacts
from handler.neuron.checkpoint_identity import STATS_KEY, checkpoint_identity
from handler.neuron.config import NeuronxConfig

logger = logging.getLogger(__name__)

Bucket = tuple[int, int]  # (batch, sequence length)
# neuronx-cc's casting per handler.amp: f32 keeps fp32 (the matmuls too), f16/bf16 cast everything.
AMP_COMPILER_ARGS = {
    "f32": ["--auto-cast", "none"],
    "bf16": ["--auto-cast", "all", "--auto-cast-type", "bf16"],
    "f16": ["--auto-cast", "all", "--auto-cast-type", "fp16"],
}


def default_seq_buckets(max_length: int) -> list[int]:
    """128, 256, ... below the model's longest input, then that input: [128, 256] for a 256-token model."""
    buckets, size = [], 128
    while size < max_length:
        buckets.append(size)
        size *= 2
    return [*buckets, max_length]


def smallest_fitting(buckets: Sequence[int], size: int) -> int:
    return next(b for b in buckets if b >= size)


def module_file(bucket: Bucket) -> str:
    return f"encoder_b{bucket[0]}_s{bucket[1]}.pt"


class PooledEncoder(torch.nn.Module):
    """What is traced: the transformer, then the checkpoint's pooling (and normalisation)."""

    def __init__(self, model: torch.nn.Module, pooling: PoolingMode, normalize: bool, token_types: bool) -> None:
        super().__init__()
        self.model, self.pooling, self.normalize, self.token_types = model, pooling, normalize, token_types

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        extra = {"token_type_ids": torch.zeros_like(input_ids)} if self.token_types else {}
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=False, **extra)[0]
        vectors = pool(hidden, attention_mask, self.pooling)
        return (l2_normalize(vectors) if self.normalize else vectors).float()


class NeuronEncoder(SentenceEncoder, DeviceBackend):
    name = "neuronx"
    settings: NeuronxConfig

    def __init__(
        self,
        config: ServingConfig,
        checkpoint: Path,
        gpu_id: int | None = None,
        workers: int = 1,
        cores: Sequence[int] | None = None,
    ) -> None:
        self.handler = config.handler
        self.settings = config.handler.neuronx
        self.checkpoint = checkpoint
        self.tp_degree = 1
        self.amp = config.handler.amp
        folder = self._read_text(checkpoint, self.handler.trust_remote_code)
        self.model_config = AutoConfig.from_pretrained(
            folder, local_files_only=True, trust_remote_code=self.handler.trust_remote_code
        )
        self._read_limits(self.model_config, self.model_config.vocab_size)
        buckets = self.handler.embed.buckets
        self.batch_buckets = list(buckets.batch_sizes)
        self.seq_buckets = list(buckets.seq_lengths or default_seq_buckets(self.max_length))
        if self.seq_buckets[-1] > self.max_length:
            raise ConfigError(
                f"model-config.yaml: handler.embed.buckets.seq_lengths: {self.seq_buckets[-1]} is above the model's "
                f"longest input ({self.max_length} tokens: max_seq_length, model_max_length, position embeddings); "
                f"keep every bucket <= {self.max_length}"
            )
        self.max_length = self.seq_buckets[-1]  # the longest input served: longer ones are refused
        self.buckets: list[Bucket] = [(b, s) for s in self.seq_buckets for b in self.batch_buckets]
        self._place_and_start(gpu_id, workers, cores)
        self._log_ready(f"{type(self).__name__} ({self.path_taken}), buckets {self.buckets}")

    # -- DeviceBackend hooks -------------------------------------------------------------
    def _prepare(self) -> dict[str, Any]:
        self.tnx = importlib.import_module("torch_neuronx")  # after the environment is set
        self.compiler_args = [*AMP_COMPILER_ARGS[self.amp], *self.settings.compiler_flags]
        return self.manifest_inputs()

    def manifest_inputs(self) -> dict[str, Any]:
        """Everything the traced modules depend on: the weights are inlined into them (the trace's
        default inline_weights_to_neff=True), so the checkpoint's content is part of it."""
        flags = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
        known = artifacts.read_manifest(self.cache.artifacts_dir) or {}
        recorded = {
            "identity": known.get("depends_on", {}).get("checkpoint") or {},
            "stats": known.get(STATS_KEY) or {},
        }
        identity, self._checkpoint_stats = checkpoint_identity(self.sentence.transformer_dir, recorded)
        sentence = {"pooling": self.sentence.pooling, "normalize": self.sentence.normalize}
        return {
            "task": "embed",
            "torch_neuronx": package_version("torch-neuronx", self.tnx),
            "neuronx_cc": compiler_version(),
            "torch": torch.__version__.split("+")[0],
            "checkpoint": identity,
            "tokenizer_pad_id": self.pad_token_id,
            "sentence": sentence,
            "buckets": {"batch_sizes": self.batch_buckets, "seq_lengths": self.seq_buckets},
            "amp": self.amp,
            "compiler_args": self.compiler_args,
            "compiler_flags": " ".join(f for f in flags if not f.startswith("--cache_dir")),
            "model_config_sha256": hashlib.sha256(
                (self.sentence.transformer_dir / "config.json").read_bytes()
            ).hexdigest()[:16],
        }

    def _load(self) -> tuple[Any | None, str]:
        started = time.perf_counter()
        folder = self.cache.artifacts_dir
        modules: dict[Bucket, Any] = {}
        for bucket in self.buckets:
            try:
                modules[bucket] = torch.jit.load(str(folder / module_file(bucket)))
            except (OSError, RuntimeError, ValueError) as exc:
                return None, f"{module_file(bucket)}: {type(exc).__name__}: {exc}"
        artifacts.record_extra(folder, STATS_KEY, self._checkpoint_stats)
        logger.info("neuronx encoder: loaded %d traced modules in %.1f s", len(modules), time.perf_counter() - started)
        return modules, ""

    def _compile(self) -> Any:
        started = time.perf_counter()
        f32 = self.handler.model_copy(update={"amp": "f32"})  # the compiler casts (AMP_COMPILER_ARGS)
        model = load_model(AutoModel, self.sentence.transformer_dir, f32)
        token_types = "token_type_ids" in inspect.signature(model.forward).parameters
        graph = PooledEncoder(model, self.sentence.pooling, self.sentence.normalize, token_types).eval()
        modules: dict[Bucket, Any] = {}
        for batch, seq in self.buckets:
            ids, mask = self.padded([[self.pad_token_id]], seq, batch)
            logger.info("neuronx encoder: tracing bucket batch %d x %d tokens", batch, seq)
            modules[(batch, seq)] = self.tnx.trace(graph, (ids, mask), compiler_args=self.compiler_args)

        def save_modules(out_dir: str) -> None:
            Path(out_dir).mkdir(parents=True, exist_ok=True)
            for bucket, module in modules.items():
                torch.jit.save(module, str(Path(out_dir) / module_file(bucket)))

        artifacts.save(self.cache.artifacts_dir, self.expected, save_modules, {STATS_KEY: self._checkpoint_stats})
        logger.info(
            "neuronx encoder: traced %d buckets in %.1f s into %s",
            len(modules),
            time.perf_counter() - started,
            self.cache.artifacts_dir,
        )
        return modules

    # -- the encoder surface -------------------------------------------------------------
    def plan(self, rows: Sequence[Sequence[int]]) -> list[tuple[Bucket, list[int]]]:
        """The calls `encode` makes: (bucket, the row indices it carries), rows in input order."""
        by_seq: dict[int, list[int]] = {}
        for index, row in enumerate(rows):
            by_seq.setdefault(smallest_fitting(self.seq_buckets, len(row)), []).append(index)
        largest = self.batch_buckets[-1]
        calls = []
        for seq, indices in sorted(by_seq.items()):
            for start in range(0, len(indices), largest):
                group = indices[start : start + largest]
                calls.append(((smallest_fitting(self.batch_buckets, len(group)), seq), group))
        return calls

    def encode(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[len(rows), dimension] float32 sentence embeddings of token-id rows (each 1..max_length ids),
        one traced call per planned bucket."""
        if not rows:
            return torch.empty((0, self.dimension), dtype=torch.float32)
        self._check_rows(rows)
        modules = self._running_model()
        out = torch.empty((len(rows), self.dimension), dtype=torch.float32)
        with torch.inference_mode():  # a loaded ScriptModule's parameters ask for gradients otherwise
            for (batch, seq), group in self.plan(rows):
                ids, mask = self.padded([rows[i] for i in group], seq, batch)
                vectors = modules[(batch, seq)](ids, mask)
                out[group] = vectors[: len(group)].float()
        return out

    def warmup(self) -> None:
        """One call per bucket (each traced shape runs once before the first request)."""
        if not self.settings.warmup:
            return
        started = time.perf_counter()
        row = self.tokenize("Hello, world")[: self.seq_buckets[0]]
        with torch.inference_mode():
            for batch, seq in self.buckets:
                ids, mask = self.padded([row] * batch, seq, batch)
                self._running_model()[(batch, seq)](ids, mask)
        logger.info("neuronx encoder: warmed %d buckets in %.2f s", len(self.buckets), time.perf_counter() - started)
