"""The `handler.nxdi:` section of model-config.yaml (read only by the nxdi backend: NxD
Inference, Neuron SDK 2.26-2.31).

As for neuronx, the model-wide keys stay in `handler:` (`tp_degree`, `amp`, `n_positions`)
and `scheduler.n_slots` is the compiled batch size. The backend builds NxDI's NeuronConfig
itself: continuous batching with one prompt per context-encoding call, the buckets, the
dtype, sharded weights saved with the artifacts, no NKI attention kernel (Inf2 lacks the
ones NxDI may pick), and on-device sampling when asked. `neuron_config` passes further
keywords through, except those the backend owns or that change what a step call means
(REFUSED_NXDI_OPTIONS): they fail at config time, naming the key. NxDI's NeuronConfig only
warns on a keyword it does not know, so the backend also refuses, at start, any keyword the
installed NxDI does not know (a typo must not pass silently).

`speculation` (NxdiSpeculation) compiles an EAGLE draft into the model with NxDI's fused
speculation (handler/neuron/nxdi_speculation.py has the facts): it needs on-device sampling, and
the speculation keywords are the backend's (refused in `neuron_config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from handler.neuron.config import DeviceSection, Option
from handler.request import GenerationRequest, SamplingParams

NXDI_OPTIONS_KEY = "handler.nxdi.neuron_config"
DEFAULT_MODEL_CLASS = "llama.modeling_llama.NeuronLlamaForCausalLM"
DEFAULT_GLOBAL_TOPK = 256  # OnDeviceSamplingConfig's default: the candidates the device samples from

_OWNED = "the backend sets it from the rest of model-config.yaml"
_SLOTS = f"{_OWNED} (continuous batching with scheduler.n_slots slots and one prompt per context encoding)"
_STEP = "it changes what a step call takes or returns, which the step contract (handler/backends/base.py) relies on"
_SPECULATION = (
    f"{_OWNED}: handler.nxdi.speculation (EAGLE with fused speculation; draft-model and Medusa speculation serve one "
    "sequence at a time)"
)
REFUSED_NXDI_OPTIONS: dict[str, str] = {
    **{
        key: _SLOTS
        for key in (
            "batch_size",
            "ctx_batch_size",
            "tkg_batch_size",
            "max_batch_size",
            "kv_cache_batch_size",
            "is_continuous_batching",
        )
    },
    "seq_len": f"{_OWNED}: handler.n_positions",
    "n_positions": f"{_OWNED}: handler.n_positions",
    "max_length": f"{_OWNED}: handler.n_positions",
    "max_new_tokens": f"{_OWNED}: handler.n_positions",
    "max_context_length": f"{_OWNED}: handler.nxdi.context_buckets (the largest)",
    "enable_bucketing": f"{_OWNED}: always on",
    "buckets": f"{_OWNED}: handler.nxdi.context_buckets / token_buckets",
    "context_encoding_buckets": f"{_OWNED}: handler.nxdi.context_buckets",
    "token_generation_buckets": f"{_OWNED}: handler.nxdi.token_buckets",
    "tp_degree": f"{_OWNED}: handler.tp_degree",
    "torch_dtype": f"{_OWNED}: handler.amp",
    "on_device_sampling_config": f"{_OWNED}: handler.nxdi.on_device_sampling",
    "save_sharded_checkpoint": f"{_OWNED}: handler.nxdi.save_sharded_checkpoint",
    "attn_kernel_enabled": f"{_OWNED}: handler.nxdi.attn_kernel_enabled",
    "padding_side": f"{_OWNED}: prompts are right-padded",
    "output_logits": _STEP,
    "async_mode": _STEP,
    "is_block_kv_layout": _STEP,
    "is_prefix_caching": _STEP,
    "chunked_prefill_config": _STEP,
    "speculation_length": _SPECULATION,
    "enable_fused_speculation": _SPECULATION,
    "enable_eagle_speculation": _SPECULATION,
    "is_eagle3": _SPECULATION,
    "is_eagle_draft": f"{_OWNED}: the backend sets it on the EAGLE draft's config (handler.nxdi.speculation)",
    "trace_tokengen_model": "NxD Inference 0.6-0.10 derives it from the speculation settings and ignores the keyword "
    "(models/config.py); use handler.nxdi.speculation",
    "token_tree_config": _STEP,
    "is_medusa": _STEP,
    "medusa_speculation_length": _STEP,
    "lora_config": f"{_OWNED}: handler.lora (adapters, max_loras, max_lora_rank) and handler.nxdi.dynamic_multi_lora",
}


def refused_nxdi_options(options: Mapping[str, Option]) -> list[str]:
    return [
        f"{NXDI_OPTIONS_KEY}.{key}: refused: {REFUSED_NXDI_OPTIONS[key]}; remove the key"
        for key in options
        if key in REFUSED_NXDI_OPTIONS
    ]


def device_sampling_refusal(request: GenerationRequest, global_topk: int) -> tuple[str, str] | None:
    """(the request field, why) for what NxDI's on-device sampler cannot do: it takes a row's
    top_k (at most global_topk), top_p and temperature, and nothing else (no seed input, no
    logits processing, no grammar mask). `stop_token_ids` pass: they end a sequence on the host
    (`Sequence`), whatever picked the token; suppressing them (and EOS) is min_tokens', refused."""
    sampling = request.sampling
    why = "handler.nxdi.on_device_sampling is on and the device sampler takes only top_k, top_p and temperature"
    if sampling.seed is not None and sampling.seed_from_client:
        return "seed", why
    if sampling.repetition_penalty != 1.0:
        return "repetition_penalty", why
    if sampling.presence_penalty != 0.0:
        return "presence_penalty", why
    if sampling.frequency_penalty != 0.0:
        return "frequency_penalty", why
    if sampling.logit_bias:
        return "logit_bias", why
    if sampling.min_tokens > 0:
        return "min_tokens", f"{why}: it cannot suppress EOS and the stop tokens"
    if request.constraint is not None:
        return "constraint", f"{why}: it cannot apply a grammar mask (turn on_device_sampling off to constrain output)"
    if sampling.do_sample and sampling.top_k > global_topk:
        return "top_k", f"on-device sampling draws from the {global_topk} most likely tokens (handler.nxdi.global_topk)"
    return None


def device_sampling_row(sampling: SamplingParams, global_topk: int) -> tuple[float, float, float]:
    """NxDI's per-row sampling parameters `[top_k, top_p, temperature]`; greedy is top_k 1, and
    a sampled row without top_k draws from all global_topk candidates."""
    if not sampling.do_sample:
        return (1.0, 1.0, 1.0)
    top_k = sampling.top_k if sampling.top_k > 0 else global_topk
    return (float(top_k), float(sampling.top_p), float(sampling.temperature))


MAX_DRAFT_TOKENS = 8  # NxDI sets no bound; every step runs the draft k + 1 times and verifies k + 1 positions
# NeuronConfig keywords NxDI refuses beside fused speculation (models/config.py:610-654, ValueError).
SPECULATION_INCOMPATIBLE = ("token_generation_batches",)


class NxdiSpeculation(BaseModel):
    """`handler.nxdi.speculation`: an EAGLE draft compiled into the model with NxDI's fused
    speculation (docs/speculative.md, "EAGLE on Inferentia2"); a step gives each row 1 to k + 1 tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    method: Literal["eagle", "eagle3"] = Field(
        description="eagle: an EAGLE (v1) draft; eagle3: an EAGLE-3 draft (NeuronConfig is_eagle3, NxD Inference 0.7+ "
        "/ SDK 2.27+)",
    )
    draft_model_path: str = Field(
        min_length=1,
        description="the draft's Hugging Face checkpoint folder (absolute, or relative to the model archive like the "
        "checkpoint); it must hold the model's LM head (lm_head.weight), and its content is part of the compiled "
        "artifacts' manifest",
    )
    num_speculative_tokens: int = Field(
        ge=1,
        le=MAX_DRAFT_TOKENS,
        description="k: tokens the draft proposes per row per step (NxDI's speculation_length is k + 1); a request's "
        "prompt + max_new_tokens may use n_positions - (k - 1) positions",
    )

    def draft_path(self, model_dir: str | Path) -> Path:
        """The draft's absolute folder (a relative one is inside the model archive)."""
        path = Path(self.draft_model_path)
        return path if path.is_absolute() else Path(model_dir) / path


def _check_buckets(value: list[int] | None) -> list[int] | None:
    if value is None:
        return None
    if not value or value[0] < 2:
        raise ValueError("must be a non-empty list of token counts of at least 2, e.g. [128, 512, 1024]")
    if sorted(set(value)) != value:
        raise ValueError("must be strictly increasing, e.g. [128, 512, 1024]")
    return value


class NxdiConfig(DeviceSection):
    model_class: str = Field(
        default=DEFAULT_MODEL_CLASS,
        min_length=1,
        description="a class under neuronx_distributed_inference.models: "
        "'llama.modeling_llama.NeuronLlamaForCausalLM' (Llama 2/3.x, and Mistral: SDK 2.28 has no Mistral class; "
        "vLLM's Neuron loader serves it with the Llama one), 'qwen2.modeling_qwen2.NeuronQwen2ForCausalLM', "
        "'qwen3.modeling_qwen3.NeuronQwen3ForCausalLM'",
    )
    context_buckets: list[int] | None = Field(
        default=None,
        description="prompt (context encoding) buckets; default powers of two from 128 up to n_positions. A prompt "
        "runs in the first bucket longer than it (or the largest, if equal); the largest is the longest prompt served",
    )
    token_buckets: list[int] | None = Field(
        default=None,
        description="decode (token generation) buckets; default powers of two from 128 up to n_positions",
    )
    on_device_sampling: bool = Field(
        default=False,
        description="sample on the device (OnDeviceSamplingConfig(dynamic=True)): each row's top_k / top_p / "
        "temperature; requests asking for a seed, a penalty, logit_bias, min_tokens, a constraint (structured "
        "output), logprobs or top_k above global_topk get a 400",
    )
    global_topk: int = Field(
        default=DEFAULT_GLOBAL_TOPK, ge=1, le=4096, description="on-device sampling: candidates per row"
    )
    save_sharded_checkpoint: bool = Field(
        default=True,
        description="save the weights sharded per tp rank with the artifacts, so a load does not re-shard the "
        "checkpoint in host RAM (an 8B checkpoint sharded at load exhausts an inf2.xlarge's 16 GB)",
    )
    attn_kernel_enabled: bool = Field(
        default=False,
        description="NxDI's NKI context-encoding attention kernel; off: SDK >= 2.29 may pick one Inf2 lacks",
    )
    dynamic_multi_lora: bool = Field(
        default=False,
        description="with handler.lora: NxDI's dynamic multi-LoRA (SDK 2.27+): every adapter is held in host "
        "memory and only handler.lora.max_loras of them (plus the base) in device memory, swapped in (LRU) when a "
        "prompt needs one; off: every adapter is compiled into device memory. Needs save_sharded_checkpoint: false "
        "(NxDI 0.8 re-reads its pre-sharded host copies stacked one level too deep). NxDI 0.8 loads no adapter "
        "after start either way; with this on an adapter can be unloaded at run time",
    )
    neuron_config: dict[str, Option] = Field(
        default_factory=dict,
        description="more NxDI NeuronConfig keywords, e.g. {fused_qkv: true}; those the backend owns or cannot "
        "honour fail at config time, keywords the installed NxDI does not know fail at start",
    )
    speculation: NxdiSpeculation | None = Field(
        default=None,
        description="EAGLE speculative decoding compiled into the model (needs on_device_sampling; not with "
        "handler.lora or scheduler.mode static)",
    )

    @model_validator(mode="after")
    def _speculation_samples_on_device(self) -> NxdiConfig:
        if self.speculation is None:
            return self
        if not self.on_device_sampling:
            raise ValueError(
                "speculation needs on_device_sampling: true: NxD Inference's fused speculation picks and verifies "
                "tokens on the device (every fused forward asserts on_device_sampling_config, models/model_base.py)"
            )
        clash = [key for key in SPECULATION_INCOMPATIBLE if key in self.neuron_config]
        if clash:
            raise ValueError(
                f"neuron_config.{clash[0]} cannot go with speculation: NxD Inference refuses batch bucketing beside "
                "fused speculation (models/config.py _validate_batch_bucketing_compatibility)"
            )
        return self

    @model_validator(mode="after")
    def _dynamic_lora_needs_unsharded_weights(self) -> NxdiConfig:
        if self.dynamic_multi_lora and self.save_sharded_checkpoint:
            raise ValueError(
                "dynamic_multi_lora needs save_sharded_checkpoint: false: NxD Inference 0.8 saves each adapter's "
                "pre-sharded host copy as the whole stack of every adapter and stacks those again when it loads "
                "them (lora_checkpoint.py _shard_cpu_weights / _load_rank_checkpoint), so the first swap fails; "
                "without pre-sharded weights it re-shards the checkpoint and the adapters at load"
            )
        return self

    @field_validator("context_buckets", "token_buckets")
    @classmethod
    def _buckets(cls, value: list[int] | None) -> list[int] | None:
        return _check_buckets(value)

    @field_validator("model_class")
    @classmethod
    def _class_path(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) < 2 or not all(part.isidentifier() for part in parts):
            raise ValueError(
                "must be a module path and class under neuronx_distributed_inference.models, e.g. "
                f"'{DEFAULT_MODEL_CLASS}'"
            )
        return value

    @field_validator("neuron_config")
    @classmethod
    def _honoured_options(cls, value: dict[str, Option]) -> dict[str, Option]:
        problems = refused_nxdi_options(value)
        if problems:
            raise PydanticCustomError("neuron_config_refused", "; ".join(problems))
        return value
