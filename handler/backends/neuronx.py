"""The `neuronx` backend: a Llama-family model compiled for Inferentia2 by transformers-neuronx.

Start-up, in order (each step logged, with how long it took):
1. place this worker on its NeuronCores (handler/neuron/cores.py) and set the Neuron
   environment: NEURON_RT_VISIBLE_CORES, NEURON_CC_FLAGS, the compile cache
   (handler/neuron/environment.py), all before transformers_neuronx is imported;
2. `<ModelClass>.from_pretrained(checkpoint, batch_size=micro_batch_size, tp_degree, amp,
   n_positions, context_length_estimate, neuron_config)`; NeuronConfig options this
   left-padded static path cannot honour are refused first, and the SDK's own refusals
   (asserts, ValueErrors) become a ConfigError naming the key (handler/neuron/options.py);
3. if the saved artifacts' manifest matches (handler/neuron/artifacts.py): `load(dir)` then
   `to_neuron()`, no compile; else, under a host-wide lock, `to_neuron()` compiles and
   `save(dir)` stores the NEFFs with a fresh manifest. With `compile_on_start: false` a
   mismatch fails the start instead, and nothing is written (read-only model directories);
4. wrap the model in `HuggingFaceGenerationModelAdapter`, so `GenerateBackend` serves it
   with Hugging Face `generate`, exactly like the hf backend;
5. `warmup()`: one generation per context bucket, so no user request pays a first run.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import importlib
import importlib.metadata
import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from transformers import AutoConfig, GenerationMixin

from handler.backends.base import RowSpec, clamp_n_positions
from handler.backends.generate_backend import GenerateBackend
from handler.backends.hf import eos_token_ids, load_tokenizer
from handler.config import ConfigError, ServingConfig
from handler.neuron import artifacts, options
from handler.neuron.config import NeuronxConfig
from handler.neuron.cores import CorePlacement, detect_cores, place
from handler.neuron.environment import CacheLocation, configure_compiler, pin_cores
from handler.protocol import SamplingParams

logger = logging.getLogger(__name__)

WARMUP_NEW_TOKENS = 2


def default_buckets(n_positions: int) -> list[int]:
    """Context buckets: powers of two from 128 up to n_positions (which is always the last)."""
    buckets, size = [], 128
    while size < n_positions:
        buckets.append(size)
        size *= 2
    return [*buckets, n_positions]


def context_buckets(neuronx: NeuronxConfig, n_positions: int) -> list[int]:
    buckets = neuronx.context_length_estimate or default_buckets(n_positions)
    if buckets[-1] > n_positions:
        raise ConfigError(
            f"model-config.yaml: handler.neuronx.context_length_estimate: bucket {buckets[-1]} is above n_positions "
            f"({n_positions}); keep every bucket <= n_positions"
        )
    return buckets


@functools.cache
def generation_capable(adapter_cls: type) -> type:
    """HuggingFaceGenerationModelAdapter subclasses only PreTrainedModel, which stopped
    inheriting GenerationMixin in transformers 4.50: mix it back in where it is missing
    (a no-op on the 4.4x releases the Neuron SDK pins)."""
    if issubclass(adapter_cls, GenerationMixin):
        return adapter_cls
    return type(adapter_cls.__name__, (adapter_cls, GenerationMixin), {"__module__": __name__})


def package_version(distribution: str, module: Any) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return getattr(module, "__version__", None)


def compiler_version() -> str | None:
    try:
        return package_version("neuronx-cc", importlib.import_module("neuronxcc"))
    except ImportError:
        return None


class NeuronxBackend(GenerateBackend):
    name = "neuronx"

    def __init__(self, config: ServingConfig, checkpoint: Path, gpu_id: int | None = None, workers: int = 1) -> None:
        handler = config.handler
        self.settings = handler.neuronx
        self.checkpoint = checkpoint
        self.tp_degree = handler.tp_degree
        self.amp = handler.amp
        self._batch_size = config.micro_batching.micro_batch_size
        self._generate_lock = threading.Lock()
        if config.micro_batching.parallelism.inference > 1:
            logger.warning(
                "neuronx: micro_batching.parallelism.inference=%d, but one compiled model runs one micro-batch at a "
                "time; the inference threads will take turns",
                config.micro_batching.parallelism.inference,
            )
        self.tokenizer = load_tokenizer(checkpoint, handler.trust_remote_code)
        self.pad_token_id = self.tokenizer.pad_token_id
        hf_config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
        self.eos_token_ids = eos_token_ids(hf_config, self.tokenizer)
        self.n_positions = clamp_n_positions(
            handler.n_positions, getattr(hf_config, "max_position_embeddings", None), "model"
        )
        self.buckets = context_buckets(self.settings, self.n_positions)

        available = self.settings.num_cores or detect_cores()
        self.placement: CorePlacement | None = place(gpu_id, workers, self.tp_degree, available)
        pin_cores(self.placement.visible_cores)
        logger.info(
            "neuronx: NeuronCores %s for this worker (%s; %d worker(s) x tp_degree %d of %d cores)",
            self.placement.visible_cores,
            self.placement.how,
            workers,
            self.tp_degree,
            available,
        )
        try:
            self._start(hf_config)
        except BaseException:
            self.close()  # a worker that failed to start gives its cores back at once
            raise

    def _start(self, hf_config: Any) -> None:
        self.cache = CacheLocation.resolve(self.settings.cache_dir, self.checkpoint, self.settings.compile_cache)
        logger.info("neuronx: compile cache: %s", configure_compiler(self.settings.compiler_flags, self.cache))

        self.tnx = importlib.import_module("transformers_neuronx")  # after the environment is set
        self.model_cls = self._model_class()
        self.neuron_config = self._neuron_config()
        self.expected = self.manifest_inputs(hf_config)
        self.model, self.path_taken = self._load_or_compile()
        self.generation_model = generation_capable(self.tnx.HuggingFaceGenerationModelAdapter)(hf_config, self.model)

    @property
    def static_batch_size(self) -> int:
        return self._batch_size

    def generate(self, rows: Sequence[RowSpec], streamer: Any, is_finished: Callable[[int], bool]) -> None:
        """One micro-batch at a time: the compiled model has one KV cache and the adapter one
        step counter, so concurrent inference threads (parallelism.inference > 1) take turns."""
        with self._generate_lock:
            super().generate(rows, streamer, is_finished)

    # -- configuration ---------------------------------------------------------------
    def _model_class(self) -> type:
        *module_path, class_name = self.settings.model_class.split(".")
        module_name = ".".join(["transformers_neuronx", *module_path])
        try:
            return getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            raise ConfigError(
                f"model-config.yaml: handler.neuronx.model_class: transformers_neuronx has no "
                f"{self.settings.model_class!r}; use e.g. 'LlamaForSampling' or 'mistral.model.MistralForSampling'"
            ) from None

    def _neuron_config(self) -> Any | None:
        """NeuronConfig only when an option is configured; else the model's default."""
        chosen = self._neuron_config_options()
        return options.build(self.tnx.NeuronConfig, chosen) if chosen else None

    def _neuron_config_options(self) -> dict[str, Any]:
        """The NeuronConfig keywords this configuration passes (an SDK error may name one of them)."""
        chosen: dict[str, Any] = dict(self.settings.neuron_config)
        if self.settings.group_query_attention:
            chosen["group_query_attention"] = self.tnx.GQA(self.settings.group_query_attention)
        if self.settings.quantize_weights:
            chosen["quant"] = self.tnx.QuantizationConfig(
                quant_dtype=self.settings.quantize_weights, dequant_dtype=self.amp
            )
        return chosen

    def manifest_inputs(self, hf_config: Any) -> dict[str, Any]:
        """Everything the compiled NEFFs depend on (the weights are loaded separately, so not them)."""
        flags = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
        config_json = (self.checkpoint / "config.json").read_bytes()
        return {
            "transformers_neuronx": package_version("transformers-neuronx", self.tnx),
            "neuronx_cc": compiler_version(),
            "model_class": self.settings.model_class,
            "model_config_sha256": hashlib.sha256(config_json).hexdigest()[:16],
            "batch_size": self._batch_size,
            "tp_degree": self.tp_degree,
            "amp": self.amp,
            "n_positions": self.n_positions,
            "context_length_estimate": self.buckets,
            "neuron_config": {
                "group_query_attention": self.settings.group_query_attention,
                "quantize_weights": self.settings.quantize_weights,
                **dict(sorted(self.settings.neuron_config.items())),
            },
            "compiler_flags": " ".join(f for f in flags if not f.startswith("--cache_dir")),
        }

    # -- load or compile ---------------------------------------------------------------
    def _build(self) -> Any:
        kwargs: dict[str, Any] = {
            "batch_size": self._batch_size,
            "tp_degree": self.tp_degree,
            "amp": self.amp,
            "n_positions": self.n_positions,
            "context_length_estimate": self.buckets,
        }
        if self.neuron_config is not None:
            kwargs["neuron_config"] = self.neuron_config
        try:
            return self.model_cls.from_pretrained(str(self.checkpoint), **kwargs)
        except KeyError as exc:  # an amp it has no dtype for
            key = "handler.amp" if exc.args[:1] == (self.amp,) else options.NEURON_CONFIG_KEY
            raise ConfigError(f"model-config.yaml: {key}: transformers-neuronx refused it: KeyError {exc}") from exc
        except (AssertionError, ValueError) as exc:  # its load-time sanity checks and constructor asserts
            key = options.blame(str(exc), self._neuron_config_options(), kwargs)
            raise ConfigError(
                f"model-config.yaml: {key}: transformers-neuronx refused the model settings {self._described(kwargs)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _described(self, kwargs: dict[str, Any]) -> str:
        shown = {k: v for k, v in kwargs.items() if k != "neuron_config"}
        if self.settings.neuron_config:
            shown["neuron_config"] = dict(self.settings.neuron_config)
        return str(shown)

    def _load(self) -> tuple[Any | None, str]:
        """The saved artifacts on the cores; or None and why, when their NEFFs do not fit after all."""
        started = time.perf_counter()
        model = self._build()
        model.load(str(self.cache.artifacts_dir))
        try:
            model.to_neuron()
        except FileNotFoundError as exc:
            del model
            gc.collect()
            return None, str(exc)
        logger.info(
            "neuronx: path=load: precompiled artifacts from %s on the cores in %.1f s (no compile)",
            self.cache.artifacts_dir,
            time.perf_counter() - started,
        )
        return model, ""

    def _compile(self) -> Any:
        started = time.perf_counter()
        model = self._build()
        model.to_neuron()
        logger.info(
            "neuronx: path=compile: compiled and loaded in %.1f s (batch_size=%d tp_degree=%d amp=%s n_positions=%d "
            "buckets=%s)",
            time.perf_counter() - started,
            self._batch_size,
            self.tp_degree,
            self.amp,
            self.n_positions,
            self.buckets,
        )
        try:
            artifacts.save(self.cache.artifacts_dir, self.expected, model.save)
            logger.info("neuronx: saved compiled artifacts and manifest to %s", self.cache.artifacts_dir)
        except OSError as exc:
            logger.warning(
                "neuronx: could not save artifacts to %s (%s); the next start compiles again",
                self.cache.artifacts_dir,
                exc,
            )
        return model

    def _load_or_compile(self) -> tuple[Any, str]:
        folder = self.cache.artifacts_dir
        verdict = artifacts.check(folder, self.expected)
        failed: dict[str, Any] | None = None  # the manifest whose NEFFs would not load
        reason, error = verdict.reason, ""
        if verdict.usable:
            logger.info("neuronx: %s in %s; loading", verdict.reason, folder)
            model, error = self._load()
            if model is not None:
                return model, "load"
            failed = artifacts.read_manifest(folder)
            reason = f"the manifest matches but the saved NEFFs do not fit ({error})"
        if not self.settings.compile_on_start:
            raise ConfigError(self._refuse_to_compile(reason))
        if failed is None:
            logger.info("neuronx: %s; compiling", reason)
        else:
            logger.warning("neuronx: saved artifacts in %s do not fit (%s); recompiling", folder, error)
        with artifacts.compile_lock(folder):
            # another worker may have compiled while we waited for the lock
            if artifacts.check(folder, self.expected).usable and artifacts.read_manifest(folder) != failed:
                model, error = self._load()
                if model is not None:
                    return model, "load"
                logger.warning("neuronx: saved artifacts in %s do not fit (%s); recompiling", folder, error)
            return self._compile(), "compile"

    def _refuse_to_compile(self, reason: str) -> str:
        folder = self.cache.artifacts_dir
        return (
            f"backend neuronx: cannot use the compiled artifacts in {folder}: {reason}. "
            "handler.neuronx.compile_on_start is false, so this worker does not compile (and writes nothing under "
            f"{folder.parent}); run `make compile` with this model-config.yaml on an inf2 host with the same Neuron "
            "SDK and ship the artifacts, or set compile_on_start: true (with handler.neuronx.compile_cache on a "
            "writable path if the model directory is read-only)"
        )

    # -- serving -------------------------------------------------------------------------
    def warmup(self) -> None:
        """One short generation per context bucket with the full compiled batch."""
        if not self.settings.warmup:
            return
        started = time.perf_counter()
        seed_ids = self.encode("Hello") or [self.pad_token_id]
        for bucket in self.buckets:
            length = max(1, min(bucket, self.n_positions - WARMUP_NEW_TOKENS))
            prompt = tuple((seed_ids * length)[:length])
            rows = [RowSpec(prompt, WARMUP_NEW_TOKENS, SamplingParams())] * self._batch_size
            try:
                self.generate(rows, _DiscardStreamer(), lambda _row: False)
            except Exception as exc:
                raise RuntimeError(
                    f"neuronx warm-up failed for context bucket {bucket} ({length} tokens x batch {self._batch_size}): "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
        logger.info(
            "neuronx: warm-up of %d context bucket(s) %s in %.1f s",
            len(self.buckets),
            self.buckets,
            time.perf_counter() - started,
        )

    def close(self) -> None:
        self.generation_model = None
        self.model = None
        if getattr(self, "placement", None) is not None:
            self.placement.release()
            self.placement = None


class _DiscardStreamer:
    def put(self, value: Any) -> None:
        pass

    def end(self) -> None:
        pass
