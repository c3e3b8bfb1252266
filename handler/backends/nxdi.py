"""The `nxdi` backend: a Llama-family model compiled for Inferentia2 by NxD Inference
(`neuronx-distributed-inference`, Neuron SDK 2.26-2.31), driven a step at a time with NxDI's
continuous batching. Facts and traps: shared/pitfalls.md, "NxD Inference".

Start-up, in order (each step logged):
1. place this process on its NeuronCores and set the Neuron environment (handler/neuron/),
   before NxDI is imported;
2. build NxDI's NeuronConfig from model-config.yaml: `batch_size` = `tkg_batch_size` =
   `scheduler.n_slots`, `ctx_batch_size` 1 (NxDI's KV manager takes one sequence per context
   encoding), `is_continuous_batching`, `seq_len` = `n_positions`, the buckets, `torch_dtype`
   from `amp`, sharded weights saved with the artifacts, no NKI attention kernel, and
   `OnDeviceSamplingConfig(dynamic=True)` when `handler.nxdi.on_device_sampling`. A keyword the
   installed NxDI does not know fails the start (NxDI itself only warns);
3. if our manifest matches (handler/neuron/artifacts.py): `<Model>(dir).load(dir)`, no compile
   (NxDI's `load()` checks no versions or settings itself); else, under the host-wide compile
   lock, a child process compiles into a fresh folder with its own BASE_COMPILE_WORK_DIR (NxD
   wipes that scratch folder at every compile, so two compiles must not share one), the
   folder is swapped in with the manifest, and this process loads it.

Serving (the step contract of handler/backends/base.py):
- prefill: one context-encoding call per request: `input_ids [1, T]`, `position_ids`
  `arange(T)` (NxDI takes a call with T > 1 whose smallest position is 0 for a prefill), `seq_ids
  [slot]`. It writes only that slot's KV row. The prompt runs in the first context bucket
  longer than it; the largest bucket is the longest prompt (`max_prompt_tokens`). A 1-token
  prompt needs a row of its own shape (`_context_row`).
- decode: one token-generation call over every live slot, rows sorted by slot: with all
  `n_slots` rows NxDI ignores `seq_ids` (row i is KV row i), and with fewer it runs the missing
  rows as copies of the first one, overwriting their KV at that row's position. So every live
  slot is in every decode (`decode()` refuses a call that leaves one out), the rows go in
  slot order, and the results are put back in the caller's order.
- tokens: by default the device returns float32 logits `[rows, 1, vocab]` (at SDK 2.28 a
  vocabulary that tp_degree does not divide keeps its width, with its last columns at
  finfo.min; wider logits, as with output_logits, are cut to the vocabulary) and the host's
  sampling (`host_sampling.HostSampling`) picks every row's token in one pass (all sampling
  parameters, seeds and logprobs, as on hf). With on-device sampling the device returns each
  row's token; the per-row `[top_k, top_p, temperature]` come from this backend's slot map, and
  a request that asks for what the device cannot do gets a 400 (`request_refusal`).

LoRA adapters (`lora=LoraSettings(...)`, from handler.lora; NxDI's multi-LoRA, SDK 2.27+; facts in
handler/neuron/lora.py):
- at start each adapter is read and checked against the checkpoint's shapes (refused naming it),
  and the model is compiled and loaded with `NeuronConfig(lora_config=LoraServingConfig(...))`:
  index 0 is an all-zero adapter of the backend's own (the base model: NxDI 0.8 has no index for
  it), adapter i of the settings is index i, `batch_size` is n_slots. Without
  `handler.nxdi.dynamic_multi_lora` every adapter is in device memory; with it only max_loras of
  them, the rest swapped in from host memory by NxDI at each prefill.
- every context-encoding and token-generation call carries `adapter_ids`, an int32 tensor of the
  rows' indices built here (never NxDI's `convert_adapter_ids_to_indices`, which refuses more rows
  than max_loras). NxDI binds a slot's adapter at its context encoding and a token-generation call
  runs each slot with it (lora_layer.py:57-63): the decode's indices are each slot's own, and a
  decode row naming another adapter than its prefill's fails alone.
- the adapters' files are in the manifest: one changed on disk recompiles (or is refused with
  compile_on_start off), never served stale. NxDI records the adapters' folders in
  neuron_config.json and checks them at load; the backend loads with the folders configured now
  (the content is the manifest's business), so artifacts compiled elsewhere load here.
- at run time (handler.lora.runtime_updates) NxDI 0.8 loads no adapter (LoraModelManager.add_adapter
  does nothing, lora_model.py:556-559); with dynamic multi-LoRA an adapter can be unloaded
  (remove_adapter, 561-563).

EAGLE speculation (`handler.nxdi.speculation`; NxDI's fused speculation, facts and line numbers in
handler/neuron/nxdi_speculation.py):
- compiled: the target's NeuronConfig with `speculation_length` k + 1, `enable_fused_speculation`,
  `enable_eagle_speculation` (and `is_eagle3`), and `fused_spec_config = FusedSpecNeuronConfig(
  <class>._model_cls, draft_config, draft_model_path)` whose draft config is the target's NeuronConfig
  copied with `is_eagle_draft` and without fused speculation, on the draft's config.json. The draft's
  content (config.json and each weight file's SHA-256) is in the manifest: a changed draft recompiles
  or is refused, never served stale; a moved one loads (its folder is set into the loaded config).
- served: `tokens_per_step` k + 1 and `draft_tokens` k (the engine proposes nothing). Prefill is one
  fused context encoding per request (its first token is column 0 of the accepted tokens); each
  decode step is one fused call over every live slot, which answers per row 1 to k + 1 accepted
  tokens and the next position; a row keeps at most its `max_tokens` and its slot advances by what it
  kept. Each call needs position + k + 1 within the largest token bucket, so requests may use
  n_positions - (k - 1) positions (`n_positions` is that; NxDI's seq_len stays handler.n_positions).
- not with host sampling (NxDI asserts on-device sampling), LoRA (the fused model drops adapter_ids)
  or static mode: refused at config time.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from handler.backends.device_backend import compiler_version, package_version
from handler.backends.device_slots import LiveSlot, SlotDeviceBackend
from handler.backends.memory_fit import nxdi_lora_layout
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.lora.adapters import AdapterError, AdapterSpec, read_adapter
from handler.neuron import artifacts
from handler.neuron import lora as nxdi_lora
from handler.neuron import nxdi_speculation as eagle
from handler.neuron.checkpoint_identity import STATS_KEY, checkpoint_identity
from handler.neuron.environment import child_environment
from handler.neuron.lora import AdapterIndex, LoraSettings, NxdiLoraLayout
from handler.neuron.memory import LoraLayout
from handler.neuron.nxdi_config import (
    NXDI_OPTIONS_KEY,
    NxdiConfig,
    NxdiSpeculation,
    device_sampling_refusal,
    device_sampling_row,
)
from handler.request import (
    DecodeRow,
    GenerationRequest,
    SamplingParams,
    SlotRequest,
    SlotRequestError,
    TokenChoice,
)

logger = logging.getLogger(__name__)

SDK = "neuronx_distributed_inference"
TORCH_DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}
PAD_ID = 0  # what a 1-token prompt's row is padded with (masked out)
COMPILE_LOG_TAIL = 4000  # characters of a failed compile's output kept in the error
DRAFT_STATS_KEY = "speculation_draft_stats"  # the manifest's entry for the EAGLE draft files' size and mtime


@dataclass(frozen=True)
class ModelRecipe:
    """Everything that builds the NxDI model, in plain JSON values: the worker and its compile
    child build the same model from it."""

    checkpoint: str
    model_class: str  # under neuronx_distributed_inference.models
    neuron_config: dict[str, Any]  # NeuronConfig keywords; torch_dtype as its name
    on_device_sampling: dict[str, Any] | None = None  # OnDeviceSamplingConfig keywords
    lora: dict[str, Any] | None = None  # LoraServingConfig keywords (adapters' folders included)
    draft_model_path: str | None = None  # EAGLE: the draft's checkpoint (speculation keywords in neuron_config)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelRecipe:
        return cls(**json.loads(text))


@dataclass
class Sdk:
    """The NxDI classes this backend uses, imported after the environment is set."""

    neuron_config_cls: Any
    sampling_config_cls: Any
    model_cls: Any
    load_pretrained_config: Any = field(repr=False)
    fused_spec_config_cls: Any = field(default=None, repr=False)  # None: an NxDI without fused speculation

    @classmethod
    def load(cls, model_class: str) -> Sdk:
        config = importlib.import_module(f"{SDK}.models.config")
        hf_adapter = importlib.import_module(f"{SDK}.utils.hf_adapter")
        *module_path, class_name = model_class.split(".")
        try:
            model_cls = getattr(importlib.import_module(".".join([SDK, "models", *module_path])), class_name)
        except (ImportError, AttributeError):
            raise ConfigError(
                f"model-config.yaml: handler.nxdi.model_class: {SDK}.models has no {model_class!r}; use e.g. "
                "'llama.modeling_llama.NeuronLlamaForCausalLM' or 'qwen2.modeling_qwen2.NeuronQwen2ForCausalLM'"
            ) from None
        return cls(
            config.NeuronConfig,
            config.OnDeviceSamplingConfig,
            model_cls,
            hf_adapter.load_pretrained_config,
            getattr(config, "FusedSpecNeuronConfig", None),
        )

    def neuron_config(self, recipe: ModelRecipe) -> Any:
        """NxDI's NeuronConfig for the recipe; a keyword it does not know is refused (it would only warn)."""
        kwargs = dict(recipe.neuron_config)
        kwargs["torch_dtype"] = getattr(torch, kwargs["torch_dtype"])
        if recipe.on_device_sampling is not None:
            kwargs["on_device_sampling_config"] = self.sampling_config_cls(**recipe.on_device_sampling)
        if recipe.lora is not None:
            kwargs["lora_config"] = lora_serving_config_cls()(**recipe.lora)
        neuron_config = self.neuron_config_cls(**kwargs)
        unknown = sorted(key for key in kwargs if not hasattr(neuron_config, key))
        if unknown:
            raise ConfigError(
                f"model-config.yaml: {NXDI_OPTIONS_KEY}: the installed NxD Inference has no NeuronConfig keyword "
                f"{', '.join(repr(k) for k in unknown)} (it would only warn and ignore it); check the spelling"
            )
        return neuron_config

    def build(self, recipe: ModelRecipe) -> Any:
        """The model ready to compile, from the Hugging Face checkpoint (and the EAGLE draft's)."""
        config_cls = self.model_cls.get_config_cls()
        config = config_cls(self.neuron_config(recipe), load_config=self.load_pretrained_config(recipe.checkpoint))
        if recipe.draft_model_path is not None:
            config.fused_spec_config = self.fused_spec_config(config, recipe.draft_model_path)
        return self.model_cls(recipe.checkpoint, config)

    def fused_spec_config(self, config: Any, draft_model_path: str) -> Any:
        """FusedSpecNeuronConfig for the EAGLE draft, as NxDI's own demo builds it (inference_demo.py:503-532 at
        cd3abf3): the target's NeuronConfig copied, with the draft's attributes set after construction."""
        if self.fused_spec_config_cls is None:
            raise ConfigError(
                "model-config.yaml: handler.nxdi.speculation: the installed NxD Inference has no FusedSpecNeuronConfig"
            )
        draft_neuron_config = copy.deepcopy(config.neuron_config)
        for key, value in eagle.DRAFT_ATTRIBUTES.items():
            setattr(draft_neuron_config, key, value)
        draft_config = self.model_cls.get_config_cls()(
            draft_neuron_config, load_config=self.load_pretrained_config(draft_model_path)
        )
        return self.fused_spec_config_cls(
            self.model_cls._model_cls, draft_config=draft_config, draft_model_path=draft_model_path
        )


LORA_KEYWORDS = ("batch_size", "dynamic_multi_lora", "max_cpu_loras", "lora_ckpt_paths_cpu")


def lora_serving_config_cls() -> Any:
    """NxDI's LoraServingConfig, refused (ConfigError) where it lacks what this backend passes: NxDI
    0.6 (SDK 2.26) has no batch_size or dynamic_multi_lora keyword, and numbers adapters from 1 (its
    index 0 is a zero adapter of its own, lora_checkpoint.py:246-252 at v0.6.10598)."""
    try:
        cls = importlib.import_module(f"{SDK}.modules.lora_serving").LoraServingConfig
    except (ImportError, AttributeError):
        cls = None
    missing = (
        list(LORA_KEYWORDS)
        if cls is None
        else [key for key in LORA_KEYWORDS if key not in inspect.signature(cls).parameters]
    )
    if missing:
        raise ConfigError(
            "model-config.yaml: handler.lora: the installed NxD Inference's LoraServingConfig lacks "
            f"{', '.join(missing)}: LoRA on backend nxdi needs NxD Inference 0.7+ (Neuron SDK 2.27+)"
        )
    return cls


def compile_model(recipe: ModelRecipe, out_dir: str) -> None:
    """The compile itself, in the calling process: what the child (handler/backends/nxdi_compile.py) runs."""
    Sdk.load(recipe.model_class).build(recipe).compile(out_dir)


def compile_in_child(recipe: ModelRecipe, out_dir: str, artifacts_dir: Path, timeout_s: float | None = None) -> None:
    """Compile into `out_dir` in a child process (NxD asks to trace in a process of its own) with the
    artifacts folder's own scratch folder (`compile_work_dir`): NxD's tracer rmtree's
    BASE_COMPILE_WORK_DIR first, so two compiles on a host must not share one, and the folder's
    absolute path is part of every graph's persistent-cache key, so it must not change between
    compiles of one configuration either. The caller holds the artifacts folder's compile lock."""
    scratch = compile_work_dir(artifacts_dir)
    env = child_environment({"BASE_COMPILE_WORK_DIR": f"{scratch}/"})
    started = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "handler.backends.nxdi_compile", out_dir],
            input=recipe.to_json(),
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # HLOs and NEFF copies: the cache and the artifacts keep them
    output = (done.stdout + done.stderr)[-COMPILE_LOG_TAIL:]
    if done.returncode != 0:
        raise RuntimeError(f"nxdi: the compile process failed (exit status {done.returncode}): {output}")
    logger.info("nxdi: compiled in a child process in %.1f s", time.perf_counter() - started)


def compile_work_dir(artifacts_dir: Path) -> Path:
    """The scratch folder of the compiles into `artifacts_dir`: the same path every time (the
    persistent compile cache's keys hash the compiler flags, which name a log file inside it)."""
    return artifacts_dir.with_name(f"{artifacts_dir.name}.compile-work").absolute()


@dataclass
class _Slot(LiveSlot):
    """A live sequence, with its row of device sampling parameters."""

    sampling_row: tuple[float, float, float] = (1.0, 1.0, 1.0)
    adapter: str | None = None  # the LoRA adapter its prefill bound to the slot (None: the base model)
    adapter_index: int = 0  # its index in the compiled model


class NxdiBackend(SlotDeviceBackend):
    name = "nxdi"
    settings: NxdiConfig
    decode_trap = "NxDI runs a slot left out as a copy of the first row, overwriting its KV"

    def __init__(
        self,
        config: ServingConfig,
        checkpoint: Path,
        gpu_id: int | None = None,
        workers: int = 1,
        cores: Sequence[int] | None = None,
        lora: LoraSettings | None = None,
        draft: Path | None = None,
    ) -> None:
        """`lora`: the adapters to serve (handler.lora), compiled into the model; None: none. `draft`: the
        EAGLE draft's folder with handler.nxdi.speculation (default: its draft_model_path, a relative one
        from the current directory)."""
        self.speculation: NxdiSpeculation | None = config.handler.nxdi.speculation
        self.draft_dir: Path | None = None
        self._draft_stats: dict[str, Any] = {}
        if self.speculation is not None:
            self.draft_dir = draft if draft is not None else self.speculation.draft_path(".")
            self.draft_tokens = self.speculation.num_speculative_tokens  # the model drafts; the engine proposes none
            self.tokens_per_step = eagle.speculation_length(self.draft_tokens)
        self.lora_settings = lora
        self.lora_layout: NxdiLoraLayout | None = None
        self.adapter_specs: dict[str, AdapterSpec] = {}  # the adapters served, by name, as read at start
        self._adapters = AdapterIndex(())
        self._lora_identities: dict[str, Any] = {}
        self._lora_stats: dict[str, Any] = {}
        self._base_adapter_dir: Path | None = None
        super().__init__(config, checkpoint, gpu_id, workers, cores)

    def _plan_buckets(self) -> list[int]:
        context_buckets = self._checked_buckets(self.settings.context_buckets, "context_buckets")
        self.token_buckets = self._checked_buckets(self.settings.token_buckets, "token_buckets")
        check_reachable_positions(context_buckets, self.token_buckets, self.n_positions)
        self.compiled_positions = self.n_positions  # NxDI's seq_len
        if self.speculation is not None:
            # every fused decode needs position + k + 1 within the largest bucket (handler/neuron/nxdi_speculation.py)
            self.n_positions = eagle.served_positions(self.token_buckets[-1], self.draft_tokens)
            logger.info(
                "nxdi: EAGLE with k=%d: requests may use %d of the %d compiled positions (the rest is look-ahead)",
                self.draft_tokens,
                self.n_positions,
                self.compiled_positions,
            )
        return context_buckets

    def _int8_weights(self) -> bool:
        return bool(self.settings.neuron_config.get("quantized"))  # NxDI's weight quantization keyword

    @property
    def on_device(self) -> bool:
        return self.settings.on_device_sampling

    @property
    def samples_on_host(self) -> bool:
        return not self.on_device

    def _prepare(self) -> dict[str, Any]:
        self.sdk = Sdk.load(self.settings.model_class)  # after the environment is set
        if self.lora_settings is not None:
            self.lora_layout = self._plan_lora(self.lora_settings)
        if self.draft_dir is not None:
            refusal = eagle.draft_refusal(self.draft_dir, self.hf_config)
            if refusal:
                raise ConfigError(f"model-config.yaml: handler.nxdi.speculation.draft_model_path: {refusal}")
            if self.sdk.fused_spec_config_cls is None:
                raise ConfigError(
                    "model-config.yaml: handler.nxdi.speculation: the installed NxD Inference has no fused speculation "
                    "(FusedSpecNeuronConfig)"
                )
        self.recipe = self.model_recipe()
        self.sdk.neuron_config(self.recipe)  # unknown keywords fail here, before any compile
        return self.manifest_inputs()

    # -- LoRA: the adapters, read and checked before anything compiles ---------------------------
    def _plan_lora(self, settings: LoraSettings) -> NxdiLoraLayout:
        lora_serving_config_cls()  # the installed NxDI can take what follows
        model_type = getattr(self.hf_config, "model_type", None)
        shapes = nxdi_lora.llama_lora_shapes(self.hf_config)
        if model_type not in nxdi_lora.LORA_MODEL_TYPES or shapes is None:
            raise ConfigError(
                f"model-config.yaml: handler.lora: backend nxdi serves LoRA adapters on the Llama family "
                f"({', '.join(nxdi_lora.LORA_MODEL_TYPES)}), not on a {model_type!r} checkpoint"
            )
        specs = []
        for name, path in settings.adapters:
            try:
                spec = read_adapter(name, path, settings.max_lora_rank, shapes)
            except AdapterError as exc:
                raise ConfigError(f"model-config.yaml: handler.lora.adapters: {exc}") from None
            refusal = nxdi_lora.nxdi_rank_refusal(name, spec.rank)
            if refusal:
                raise ConfigError(f"model-config.yaml: handler.lora.adapters: {refusal}")
            specs.append(spec)
        manifest = artifacts.read_manifest(self.cache.artifacts_dir) or {}
        files = manifest.get("depends_on", {}).get("lora", {}).get("adapters", {})
        stats = manifest.get(nxdi_lora.STATS_KEY, {})
        for spec in specs:  # a file whose size and mtime the manifest recorded keeps its digest unread
            known = {"identity": files.get(spec.name, {}), "stats": stats.get(spec.name, {})}
            self._lora_identities[spec.name], self._lora_stats[spec.name] = nxdi_lora.adapter_identity(spec.path, known)
        targets = sorted({module for spec in specs for module in spec.target_modules})
        self._base_adapter_dir = Path(tempfile.mkdtemp(prefix="nxdi-lora-base-"))
        nxdi_lora.write_base_adapter(self._base_adapter_dir, shapes, targets)
        layout = NxdiLoraLayout.build(
            settings,
            self.settings.dynamic_multi_lora,
            [spec.rank for spec in specs],
            targets,
            self._base_adapter_dir,
            self.n_slots,
        )
        self.adapter_specs = {spec.name: spec for spec in specs}
        self._adapters = AdapterIndex(layout.names)
        logger.info(
            "nxdi: %d LoRA adapter(s) (%s), rank <= %d, targets %s, %s",
            len(specs),
            ", ".join(f"{name}={i}" for i, name in enumerate(layout.names)),
            layout.keywords["max_lora_rank"],
            targets,
            f"dynamic: {settings.max_loras} in device memory"
            if self.settings.dynamic_multi_lora
            else "all in device memory",
        )
        return layout

    def _lora_extra(self) -> dict[str, Any]:
        """The manifest's entries `check` does not compare: the adapter files' stats."""
        return {nxdi_lora.STATS_KEY: self._lora_stats} if self.lora_layout is not None else {}

    # -- configuration ---------------------------------------------------------------
    def model_recipe(self) -> ModelRecipe:
        settings = self.settings
        neuron_config: dict[str, Any] = {
            **settings.neuron_config,
            "tp_degree": self.tp_degree,
            "batch_size": self.n_slots,
            "tkg_batch_size": self.n_slots,
            "max_batch_size": self.n_slots,
            "ctx_batch_size": 1,
            "is_continuous_batching": True,
            "seq_len": self.compiled_positions,
            "max_context_length": self.max_prompt_tokens,
            "enable_bucketing": True,
            "context_encoding_buckets": self.context_buckets,
            "token_generation_buckets": self.token_buckets,
            "torch_dtype": TORCH_DTYPES[self.amp],
            "save_sharded_checkpoint": settings.save_sharded_checkpoint,
            "attn_kernel_enabled": settings.attn_kernel_enabled,
        }
        on_device = None
        if self.on_device:
            on_device = {"dynamic": True, "do_sample": True, "global_topk": settings.global_topk}
        lora = self.lora_layout.keywords if self.lora_layout is not None else None
        draft = None
        if self.speculation is not None and self.draft_dir is not None:
            neuron_config |= eagle.target_keywords(self.speculation.method, self.draft_tokens)
            draft = str(self.draft_dir)
        return ModelRecipe(str(self.checkpoint), settings.model_class, neuron_config, on_device, lora, draft)

    def manifest_inputs(self) -> dict[str, Any]:
        """What the compiled model and its saved sharded weights depend on."""
        return {
            "neuronx_distributed_inference": package_version("neuronx-distributed-inference", _module(SDK)),
            "neuronx_distributed": package_version("neuronx-distributed", _module("neuronx_distributed")),
            "torch_neuronx": package_version("torch-neuronx", _module("torch_neuronx")),
            "neuronx_cc": compiler_version(),
            "model_class": self.settings.model_class,
            "checkpoint": self._checkpoint_identity(),
            "neuron_config": self.recipe.neuron_config,
            "on_device_sampling": self.recipe.on_device_sampling,
            "compiler_flags": os.environ.get("NEURON_CC_FLAGS", ""),
            **({"lora": self.lora_layout.manifest(self._lora_identities)} if self.lora_layout is not None else {}),
            **({"speculation": self._speculation_identity()} if self.speculation is not None else {}),
        }

    def _speculation_identity(self) -> dict[str, Any]:
        """The EAGLE draft's part of the manifest: the method, k and the draft checkpoint's content (its weights
        are in the saved shards with save_sharded_checkpoint, application_base.py:658-671), not its folder: a
        draft moved with the same content loads."""
        assert self.speculation is not None and self.draft_dir is not None
        known = artifacts.read_manifest(self.cache.artifacts_dir) or {}
        recorded = {
            "identity": known.get("depends_on", {}).get("speculation", {}).get("draft", {}),
            "stats": known.get(DRAFT_STATS_KEY, {}),
        }
        identity, self._draft_stats = checkpoint_identity(self.draft_dir, recorded)
        return {
            "method": self.speculation.method,
            "num_speculative_tokens": self.speculation.num_speculative_tokens,
            "draft": identity,
        }

    def _extra_stats(self) -> dict[str, Any]:
        """The manifest's entries `check` does not compare: the files' size and mtime, by what they belong to."""
        extra = {STATS_KEY: self._checkpoint_stats, **self._lora_extra()}
        if self.speculation is not None:
            extra[DRAFT_STATS_KEY] = self._draft_stats
        return extra

    def _checkpoint_identity(self) -> dict[str, Any]:
        """The checkpoint's content (what the pre-sharded weights in the artifacts were cut from),
        reusing the digests the manifest recorded for files whose size and mtime are unchanged."""
        known = artifacts.read_manifest(self.cache.artifacts_dir) or {}
        recorded = {"identity": known.get("depends_on", {}).get("checkpoint", {}), "stats": known.get(STATS_KEY, {})}
        identity, self._checkpoint_stats = checkpoint_identity(self.checkpoint, recorded)
        return identity

    # -- load or compile ---------------------------------------------------------------
    def _load(self) -> tuple[Any | None, str]:
        started = time.perf_counter()
        folder = str(self.cache.artifacts_dir)
        try:
            if self.lora_layout is None and self.speculation is None:
                model = self.sdk.model_cls(folder)
            else:
                model = self.sdk.model_cls(folder, self._config_with_paths_here(folder))
            model.load(folder)
        except (FileNotFoundError, ValueError) as exc:  # what NxDI raises for a folder it cannot load
            return None, f"{type(exc).__name__}: {exc}"
        logger.info(
            "nxdi: path=load: compiled model from %s on the cores in %.1f s", folder, time.perf_counter() - started
        )
        for key, stats in self._extra_stats().items():  # e.g. after a touch
            artifacts.record_extra(self.cache.artifacts_dir, key, stats)
        return model, ""

    def _config_with_paths_here(self, folder: str) -> Any:
        """The compiled model's config (neuron_config.json) with the adapters' and the EAGLE draft's folders
        as configured now. NxDI records the folders it compiled with and, loading, rebuilds its
        LoraServingConfig from them, which checks they exist and re-reads them (lora_serving/config.py:78-85,
        192-217), and re-reads the draft's weights from `draft_model_path` when the weights are not
        pre-sharded (application_base.py:658-671): artifacts compiled on another host, or the base adapter of
        another start, would not load. What the folders hold is the manifest's business (each file's SHA-256)."""
        config_file = Path(folder) / "neuron_config.json"
        data = json.loads(config_file.read_text())
        if self.lora_layout is not None:
            lora_config = (data.get("neuron_config") or {}).get("lora_config")
            if not isinstance(lora_config, dict):
                raise ValueError(f"{config_file} has no lora_config: compiled without LoRA")
            keywords = self.lora_layout.keywords
            lora_config["lora_ckpt_paths"] = keywords["lora_ckpt_paths"]
            lora_config["lora_ckpt_paths_cpu"] = keywords.get("lora_ckpt_paths_cpu", {})
            lora_config["lora_ckpt_json"] = None
        if self.draft_dir is not None:
            fused = data.get("fused_spec_config")
            if not isinstance(fused, dict):
                raise ValueError(f"{config_file} has no fused_spec_config: compiled without speculation")
            fused["draft_model_path"] = str(self.draft_dir)
        return self.sdk.model_cls.get_config_cls().from_json_string(json.dumps(data))

    def _compile(self) -> Any:
        started = time.perf_counter()
        artifacts.save(
            self.cache.artifacts_dir,
            self.expected,
            lambda out: compile_in_child(self.recipe, out, self.cache.artifacts_dir),
            extra=self._extra_stats(),
        )
        logger.info(
            "nxdi: path=compile: compiled (n_slots=%d tp_degree=%d amp=%s n_positions=%d context buckets=%s) and saved "
            "to %s in %.1f s",
            self.n_slots,
            self.tp_degree,
            self.amp,
            self.n_positions,
            self.context_buckets,
            self.cache.artifacts_dir,
            time.perf_counter() - started,
        )
        model, error = self._load()
        if model is None:
            raise RuntimeError(f"nxdi: the model just compiled into {self.cache.artifacts_dir} does not load: {error}")
        return model

    # -- what requests may ask ---------------------------------------------------------------
    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        if prompt_logprobs:
            return "the nxdi backend returns the logits of a prompt's last position only"
        if logprobs and self.on_device:
            return "handler.nxdi.on_device_sampling is on: the device returns token ids, not logits"
        return None

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        if self.on_device:
            return device_sampling_refusal(request, self.settings.global_topk)
        return self.sampling.refusal(request)

    @property
    def device_sampling_topk(self) -> int | None:
        """global_topk with on-device sampling (the replicas' worker checks requests with it); None without."""
        return self.settings.global_topk if self.on_device else None

    def _sampling_row(self, sampling: SamplingParams) -> tuple[float, float, float]:
        return device_sampling_row(sampling, self.settings.global_topk)

    # -- serving: the step contract ------------------------------------------------------
    # -- LoRA: the contract's three ----------------------------------------------------------
    def lora_shapes(self) -> dict[str, tuple[int, int]] | None:
        """The checkpoint's projections an adapter may target, when started with adapters (a model
        compiled without LoRA serves none)."""
        return nxdi_lora.llama_lora_shapes(self.hf_config) if self.lora_layout is not None else None

    def load_adapter(self, spec: AdapterSpec) -> None:
        """Only an adapter this model was started with, unchanged (a no-op): NxDI 0.8 adds no adapter
        after start, dynamic multi-LoRA or not (LoraModelManager.add_adapter does nothing, "NxDI does
        not support streaming adapters", lora_model.py:556-559)."""
        if spec.name in self.adapter_specs and spec.name in self._adapters:
            known = {"identity": self._lora_identities[spec.name], "stats": self._lora_stats[spec.name]}
            identity, _ = nxdi_lora.adapter_identity(spec.path, known)  # a stat when the files are unchanged
            if identity == self._lora_identities[spec.name]:
                return
        raise NotImplementedError(
            f"backend nxdi cannot load LoRA adapter {spec.name!r} at run time: NxD Inference 0.8 serves only the "
            "adapters it was started with (handler.lora.adapters, compiled into the model; a changed adapter needs "
            "a restart, which recompiles); add it there and restart, or use backend hf"
        )

    def unload_adapter(self, name: str) -> None:
        """With dynamic multi-LoRA: NxDI drops it from host memory (remove_adapter, lora_model.py:561-563)
        and no row can name it again. Without: refused, the adapters are compiled into the model."""
        if name not in self._adapters:
            raise ValueError(f"backend nxdi serves no LoRA adapter {name!r}")
        if not self.settings.dynamic_multi_lora:
            raise NotImplementedError(
                f"backend nxdi cannot unload LoRA adapter {name!r}: without handler.nxdi.dynamic_multi_lora every "
                "adapter is compiled into device memory; set dynamic_multi_lora: true (with save_sharded_checkpoint: "
                "false) to unload at run time"
            )
        live = sorted(slot for slot, state in self._live.items() if getattr(state, "adapter", None) == name)
        if live:
            raise ValueError(f"LoRA adapter {name!r} is still in use by slot(s) {live}")
        index = self._adapters.index(name)
        self._running_model().lora_model_manager.remove_adapter(index)
        self._adapters.forget(name)
        self.adapter_specs.pop(name, None)
        logger.info("nxdi: LoRA adapter %r (index %d) unloaded", name, index)

    def _lora_memory(self) -> LoraLayout | None:
        """Its adapters' device memory, for the memory check (`lora_settings` is set before it runs)."""
        return nxdi_lora_layout(self.lora_settings, self.settings.dynamic_multi_lora)

    def runtime_adapter_refusal(self, unload: bool) -> str | None:
        if self.lora_layout is None:
            return "backend nxdi was started without LoRA adapters (handler.lora.adapters): it serves none"
        if not unload:
            return (
                "backend nxdi loads no LoRA adapter at run time: NxD Inference 0.8 serves only the adapters it was "
                "started with (LoraModelManager.add_adapter does nothing); add it to handler.lora.adapters and restart"
            )
        if not self.settings.dynamic_multi_lora:
            return (
                "backend nxdi unloads LoRA adapters only with handler.nxdi.dynamic_multi_lora: without it every "
                "adapter is compiled into device memory"
            )
        return None

    def _adapter_index(self, slot: int, adapter: str | None) -> int:
        if adapter is None:
            return 0
        if self.lora_layout is None:
            raise SlotRequestError(slot, "backend nxdi was started without LoRA adapters (handler.lora)", "model")
        try:
            return self._adapters.index(adapter)
        except KeyError:
            raise SlotRequestError(slot, f"backend nxdi serves no LoRA adapter {adapter!r}", "model") from None

    # -- serving: the step contract ------------------------------------------------------
    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        self._live.check_prefill(requests, self.context_buckets)
        indices = [self._adapter_index(request.slot, request.adapter_id) for request in requests]
        outputs = []
        for request, index in zip(requests, indices, strict=True):
            input_ids, position_ids, mask = self._context_row(request.prompt_ids)
            rows = [self._sampling_row(request.sampling)]
            outputs.append(self._forward(input_ids, position_ids, [request.slot], rows, mask, [index]))
        if self.speculation is not None:  # a fused prefill's first token is column 0 of its accepted tokens
            choices = [TokenChoice(int(out[0].reshape(-1)[0])) for out in outputs]
        elif self.on_device:
            choices = [TokenChoice(int(out.reshape(-1)[0])) for out in outputs]
        else:
            choices = self.sampling.first_tokens(requests, torch.cat([self._last_logits(o) for o in outputs]))
        for request, choice, index in zip(requests, choices, indices, strict=True):
            self._live[request.slot] = _Slot(
                choice.token_id,
                len(request.prompt_ids),
                self._sampling_row(request.sampling),
                request.adapter_id,
                index,
            )
        return choices

    def _context_row(self, prompt: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """A context-encoding call's `input_ids`, `position_ids` and `attention_mask`. NxDI takes a
        call for a prefill only when it has more than one column (a 1-token call is a decode, which
        would run every other slot as a copy of this row); it picks the bucket by the attention
        mask's width, pads position_ids with 1, and returns the logits at the first largest position
        id (model_wrapper.py `pad_inputs`, model_base.py). So a 1-token prompt goes as its token and
        PAD_ID up to the smallest bucket, at position ids all 0, with a `[1, 1]` mask: the bucket is
        the smallest, nothing is padded with 1, the padding is masked, and the logits are position
        0's. What it writes beyond position 0 is padding, as after any short prompt."""
        if len(prompt) > 1:
            positions = torch.arange(len(prompt), dtype=torch.long)[None, :]
            return torch.tensor([list(prompt)], dtype=torch.long), positions, None
        length = self.context_buckets[0]
        input_ids = torch.full((1, length), PAD_ID, dtype=torch.long)
        input_ids[0, 0] = prompt[0]
        return input_ids, torch.zeros((1, length), dtype=torch.long), torch.ones((1, 1), dtype=torch.long)

    def slot_adapter(self, slot: int) -> str | None:
        """NxDI's token generation reads the slot's active LoRA weights, bound at its prefill,
        whatever a call's adapter_ids say."""
        return getattr(self._live.get(slot), "adapter", None)

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        if self.speculation is not None:  # one token a row: the fused step's first
            return [tokens[0] for tokens in self._fused_step([DecodeRow(slot) for slot in slots])]
        slots = list(slots)
        ordered = sorted(slots)  # a full batch ignores seq_ids: row i is KV row i
        states = self._live.check_decode(ordered)
        if not slots:
            return []
        self._check_positions(ordered, states)
        out = self._forward(
            torch.tensor([[state.token] for state in states], dtype=torch.long),
            torch.tensor([[state.position] for state in states], dtype=torch.long),
            ordered,
            [state.sampling_row for state in states],
            adapter_ids=[state.adapter_index for state in states],
        )
        if self.on_device:
            choices = [TokenChoice(int(token)) for token in out.reshape(-1).tolist()]
        else:
            choices = self.sampling.next_tokens(ordered, self._last_logits(out))
        by_slot = dict(zip(ordered, choices, strict=True))
        for slot, state in zip(ordered, states, strict=True):
            state.token, state.position = by_slot[slot].token_id, state.position + 1
        return [by_slot[slot] for slot in slots]

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        if self.speculation is None:
            return super().decode_plan(rows)
        self.check_row_adapters(rows)
        return self._fused_step(rows)

    def _fused_step(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """One EAGLE step over every live slot (handler/neuron/nxdi_speculation.py): each row's input is its
        last token at its position; the fused model answers per row the tokens it accepted (1 to k + 1) and
        the next position. A row keeps at most its `max_tokens`; its slot then advances by what it kept, so
        the target's KV (written for every candidate position) is exact for the next call whatever was cut."""
        ordered = sorted(row.slot for row in rows)  # a full batch ignores seq_ids: row i is KV row i
        states = self._live.check_decode(ordered)
        if not rows:
            return []
        self._check_positions(ordered, states)
        fused = self._forward(
            torch.tensor([[state.token] for state in states], dtype=torch.long),
            torch.tensor([[state.position] for state in states], dtype=torch.long),
            ordered,
            [state.sampling_row for state in states],
        )
        accepted, next_positions = fused[0].tolist(), fused[3].reshape(-1).tolist()
        most = {row.slot: row.max_tokens for row in rows}
        by_slot: dict[int, list[TokenChoice]] = {}
        for i, (slot, state) in enumerate(zip(ordered, states, strict=True)):
            kept = eagle.row_tokens(accepted[i], state.position, int(next_positions[i]))[: most[slot]]
            state.token, state.position = kept[-1], state.position + len(kept)
            by_slot[slot] = [TokenChoice(token) for token in kept]
        return [by_slot[row.slot] for row in rows]

    def _check_positions(self, slots: list[int], states: Sequence[_Slot]) -> None:
        """NxDI picks one token-generation bucket for the whole call from its largest position, and
        a position past the largest bucket fails the call for every row ("Input len X exceeds
        largest bucket (Y) for token_generation_model", model_wrapper.py); a fused speculation call
        needs position + k + 1 within it (`_get_seq_bucket`). The start-up check and the receipt
        check keep a request within the buckets; should a row still reach past them, it fails alone,
        before the call."""
        largest = self.token_buckets[-1]
        needs = eagle.speculation_length(self.draft_tokens) if self.speculation is not None else 1
        for slot, state in zip(slots, states, strict=True):
            if state.position + needs > largest:
                raise SlotRequestError(
                    slot,
                    f"position {state.position} is past the largest compiled token bucket ({largest})",
                    "max_new_tokens",
                )

    def _last_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[rows, vocab] float32: each row's last position, the vocabulary's padding for tp_degree cut off."""
        rows = logits[:, -1, :] if logits.dim() == 3 else logits
        return rows[:, : self.vocab_size].float() if self.vocab_size else rows.float()

    def _forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: list[int],
        rows: list[tuple[float, ...]],
        attention_mask: torch.Tensor | None = None,
        adapter_ids: list[int] | None = None,
    ) -> Any:
        """Logits `[rows, positions, vocab]`, or with on-device sampling the rows' tokens, or with EAGLE
        the fused outputs (a list: accepted tokens, next input ids, next attention mask, next positions;
        model_base.py:3872-3874, hf_adapter.py:543-551). With LoRA,
        `adapter_ids` (the rows' adapter indices, 0: the base model) go as an int32 tensor, one per row:
        the program is picked by the shapes of all its inputs, and NxDI's own default (zeros) would be
        adapter index 0 for every row."""
        model = self._running_model()
        lora: dict[str, torch.Tensor] = {}
        if self.lora_layout is not None:
            ids = adapter_ids if adapter_ids is not None else [0] * len(seq_ids)
            lora["adapter_ids"] = torch.tensor(ids, dtype=torch.int32)
        with torch.inference_mode():
            out = model(
                input_ids=input_ids,
                attention_mask=attention_mask,  # None: NxDI infers it from position_ids
                position_ids=position_ids,
                seq_ids=torch.tensor(seq_ids, dtype=torch.int32),
                sampling_params=torch.tensor(rows, dtype=torch.float32),
                **lora,
            )
        # model_base.py `_construct_output`: with on-device sampling `.logits` is None and `.tokens` holds
        # each row's token (int32); without it `.logits` holds the logits; fused speculation sets no `.tokens`
        if self.speculation is not None:
            return out.fused_outputs
        return out.tokens if self.on_device else out.logits

    def _warm_up(self) -> str:
        """NxDI's load() runs its own warm-up of every bucket; one short request through the step
        contract checks this backend's side (a prefill and a decode over every slot)."""
        seed_ids = tuple(self.encode("Hello")[:2] or [self.tokenizer.eos_token_id or 1])
        try:
            self.prefill([SlotRequest(slot, seed_ids) for slot in range(self.n_slots)])
            self.decode(list(range(self.n_slots)))
        except Exception as exc:
            raise RuntimeError(f"nxdi warm-up failed: {type(exc).__name__}: {exc}") from exc
        return f"step over {self.n_slots} slot(s)"

    def close(self) -> None:
        super().close()
        if self._base_adapter_dir is not None:
            shutil.rmtree(self._base_adapter_dir, ignore_errors=True)
            self._base_adapter_dir = None


def check_reachable_positions(context_buckets: list[int], token_buckets: list[int], n_positions: int) -> None:
    """Every position a request may reach (prompt + max_new_tokens <= n_positions, checked on
    receipt) must be served by a compiled graph: NxDI itself only checks that the largest token
    bucket is <= max_length (models/config.py), and a decode past it fails the whole call mid-stream."""
    key = "model-config.yaml: handler.nxdi"
    if token_buckets[-1] < n_positions:
        raise ConfigError(
            f"{key}.token_buckets: the largest token bucket ({token_buckets[-1]}) is below n_positions "
            f"({n_positions}): a request reaching positions {token_buckets[-1] + 1}..{n_positions} would fail "
            f"mid-stream; add {n_positions} as the last token bucket, or lower handler.n_positions to "
            f"{token_buckets[-1]}"
        )
    if context_buckets[-1] > token_buckets[-1]:
        raise ConfigError(
            f"{key}.context_buckets: the largest context bucket ({context_buckets[-1]}) is above the largest "
            f"token bucket ({token_buckets[-1]}); keep every context bucket <= the largest token bucket"
        )


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
