"""The `handler.neuronx:` section of model-config.yaml (read only by the neuronx backend).

The model-wide keys the neuronx backend shares with the others stay in `handler:`
(`tp_degree`, `amp`, `n_positions`) and `scheduler.n_slots` is the compiled batch size
(transformers-neuronx's `max_num_seqs`); everything only transformers-neuronx understands
lives here.

`neuron_config` passes keywords through to transformers-neuronx's NeuronConfig, except
those this backend owns or cannot honour (REFUSED_NEURON_CONFIG). It runs the SDK's
continuous batching, which it configures itself from `scheduler.n_slots`, sends right-padded
rows with 2-D cache ids and sequence slots, and samples each slot on the host from
`[n, vocab]` logits. A keyword that would change any of that either fails in the SDK, is
silently overridden by it, or compiles and answers with corrupt text; so it fails the start
instead, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

GQA_SHARDING = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")
NEURON_CONFIG_KEY = "handler.neuronx.neuron_config"
# The smallest context bucket: a 1-token prompt's 2-token row must be shorter (handler/backends/neuronx.py).
MIN_BUCKET = 3

# Why neuronx serves no LoRA adapter: what a configuration with handler.lora and backend neuronx is refused
# with at config time, and what a request naming an adapter gets from a neuronx model. transformers-neuronx
# (0.13, its last release) has no multi-LoRA serving; NxD Inference has (modules/lora_serving/), hf has PEFT.
LORA_REFUSAL = (
    "backend neuronx serves no LoRA adapters (transformers-neuronx has no multi-LoRA serving): remove "
    "handler.lora, or use backend nxdi (NxD Inference's multi-LoRA, Neuron SDK 2.27+) or backend hf (PEFT)"
)

Option = bool | int | float | str

_OWNED = (
    "the backend configures continuous batching itself, as ContinuousBatchingConfig(max_num_seqs=scheduler.n_slots) "
    "with batch_size = scheduler.n_slots; set scheduler.n_slots instead"
)
_PADDING = (
    "continuous batching fixes the padding: right-padded rows with 2-D cache ids, which transformers-neuronx forces "
    "(padding_side 'right', lhs_aligned) whatever this key says, and which the backend sends itself"
)
_BSH = (
    "under continuous batching a BSH cache layout needs n_positions and context_length_estimate as one-bucket lists "
    "and encodes prompts as concatenated 1-D queries, which this backend does not send"
)
_NEEDS_LOGITS = "this backend samples on the host (handler/sampling/), which needs [n, vocab] logits"
_OUTPUT_SHAPE = f"it changes what the model's forward() returns; {_NEEDS_LOGITS}"
_ON_DEVICE = f"it samples on the device, so forward() returns token ids; {_NEEDS_LOGITS}"
_ALL_LOGITS = "set handler.neuronx.output_all_logits instead (the backend then reads the prefill's per-position logits)"
_EAGLE = f"it is EAGLE speculation, whose forward() also returns hidden states; {_NEEDS_LOGITS}"


def _any(_value: Option) -> bool:
    return True


def _truthy(value: Option) -> bool:
    return bool(value)


def _bsh(value: Option) -> bool:
    return str(value).upper() == "BSH"


# key -> (is the value refused?, why). transformers-neuronx 0.13's NeuronConfig derives lhs_aligned from
# padding_side == 'right', then from the deprecated use_2d_cache_ids / lhs_aligned keywords, and forces it on
# (with padding_side 'right') when continuous batching is set: so under continuous batching those three keys
# are either redundant or silently overridden, and every value is refused.
REFUSED_NEURON_CONFIG: dict[str, tuple[Callable[[Option], bool], str]] = {
    "continuous_batching": (_any, _OWNED),
    "batch_size_for_shared_caches": (_any, _OWNED),
    "max_num_seqs": (_any, _OWNED),
    "padding_side": (_any, _PADDING),
    "lhs_aligned": (_any, _PADDING),
    "use_2d_cache_ids": (_any, _PADDING),
    "cache_layout": (_bsh, _BSH),
    "output_all_logits": (_any, _ALL_LOGITS),
    "log_softmax_scores": (_truthy, _OUTPUT_SHAPE),
    "on_device_generation": (_truthy, _ON_DEVICE),
    "is_eagle_target": (_truthy, _EAGLE),
    "is_eagle_draft": (_truthy, _EAGLE),
}


def refused_neuron_config(options: Mapping[str, Option]) -> list[str]:
    """One sentence per configured NeuronConfig keyword this backend cannot honour, naming its full key."""
    problems = []
    for key, value in options.items():
        refused, why = REFUSED_NEURON_CONFIG.get(key, (None, ""))
        if refused is not None and refused(value):
            problems.append(f"{NEURON_CONFIG_KEY}.{key}: {value!r} is refused: {why}; remove the key")
    return problems


class DeviceSection(BaseModel):
    """What every Neuron backend's section (`handler.neuronx`, `handler.nxdi`) holds: where the
    compiled artifacts and the compile cache live, the cores, and whether to compile."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    compiler_flags: list[str] = Field(default_factory=list, description="extra neuronx-cc flags for NEURON_CC_FLAGS")
    cache_dir: str = Field(
        default="neuron_cache",
        min_length=1,
        description=(
            "where the compiled artifacts (saved NEFFs + manifest.json, in <cache_dir>/artifacts) are read, and "
            "written after a compile: relative to the checkpoint, absolute (shared disk) or s3:// (artifacts then "
            "stay in <checkpoint>/neuron_cache/artifacts). Also the default home of the compile cache"
        ),
    )
    compile_cache: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "the Neuron persistent compile cache (NEURON_COMPILE_CACHE_URL): an absolute, writable local path or an "
            "s3:// URL; default <cache_dir>/compile-cache. Set it when the model directory is read-only (SageMaker "
            "mounts /opt/ml/model read-only, and compiling into it fails with 'Read-only file system')"
        ),
    )
    num_cores: int | None = Field(
        default=None, ge=1, le=128, description="NeuronCores this server may use; default: counted from /dev/neuron*"
    )
    compile_on_start: bool = Field(
        default=True,
        description=(
            "false: the worker only loads artifacts that match its configuration and never compiles or writes "
            "under the checkpoint or cache_dir (no lock file, no compile cache); a mismatch fails the start, "
            "saying what differs. For read-only model directories with artifacts from `make compile`"
        ),
    )
    warmup: bool = True
    memory_check: bool = Field(
        default=True,
        description=(
            "before loading or compiling, estimate the layout's memory per NeuronCore from config.json (weights, "
            "KV cache for n_slots x n_positions, a runtime reserve; handler/neuron/memory.py) and refuse one that "
            "cannot fit in the 16 GiB of HBM; false skips the check"
        ),
    )

    @field_validator("compile_cache")
    @classmethod
    def _cache_url(cls, value: str | None) -> str | None:
        if value is None or value.startswith("s3://") or PurePosixPath(value).is_absolute():
            return value
        raise ValueError("must be an absolute local path (e.g. /tmp/neuron-compile-cache) or an s3:// URL")


class NeuronxConfig(DeviceSection):
    model_class: str = Field(
        default="LlamaForSampling",
        description="a class under transformers_neuronx: 'LlamaForSampling', 'mistral.model.MistralForSampling', ...",
        min_length=1,
    )
    context_length_estimate: list[int] | None = Field(
        default=None,
        description=(
            "prompt (context encoding) buckets, at least 3 tokens each; default: powers of two from 128 up to "
            "n_positions. The largest is the longest prompt served (a longer one is answered 400)"
        ),
    )
    group_query_attention: (
        Literal["shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads"] | None
    ) = None
    quantize_weights: Literal["s8"] | None = Field(
        default=None, description="'s8': int8 weight-only quantization (QuantizationConfig), dequantized to amp"
    )
    neuron_config: dict[str, Option] = Field(
        default_factory=dict,
        description=(
            "more NeuronConfig keywords, e.g. {fuse_qkv: true}; unknown ones fail start, and so do those the backend "
            "owns or cannot honour (continuous_batching, batch_size_for_shared_caches, max_num_seqs, padding_side, "
            "lhs_aligned, use_2d_cache_ids, cache_layout BSH, output_all_logits, log_softmax_scores, "
            "on_device_generation, EAGLE)"
        ),
    )
    output_all_logits: bool = Field(
        default=False,
        description=(
            "NeuronConfig(output_all_logits=True): a prefill returns the logits of every prompt position, which "
            "prompt logprobs (OpenAI echo with logprobs, native prompt_logprobs) need; off, such a request is answered "
            "400. Changing it recompiles (it is in the artifact manifest)"
        ),
    )

    @field_validator("context_length_estimate")
    @classmethod
    def _buckets(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value or any(b < MIN_BUCKET for b in value):
            raise ValueError(
                f"must be a non-empty list of token counts of at least {MIN_BUCKET}, e.g. [128, 512, 1024]: a 1-token "
                "prompt is encoded as a 2-token row that its bucket must pad (the SDK keeps the given cache ids of a "
                "row that fills its bucket exactly, and this row's are [0, 0])"
            )
        if sorted(set(value)) != value:
            raise ValueError("must be strictly increasing, e.g. [128, 512, 1024]")
        return value

    @field_validator("model_class")
    @classmethod
    def _class_path(cls, value: str) -> str:
        if not all(part.isidentifier() for part in value.split(".")):
            raise ValueError(
                "must be a dotted name under transformers_neuronx, e.g. 'mistral.model.MistralForSampling'"
            )
        return value

    @field_validator("neuron_config")
    @classmethod
    def _honoured_options(cls, value: dict[str, Option]) -> dict[str, Option]:
        problems = refused_neuron_config(value)
        if problems:
            raise PydanticCustomError("neuron_config_refused", "; ".join(problems))
        return value
