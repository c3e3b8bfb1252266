"""The `handler.neuronx:` section of model-config.yaml (read only by the neuronx backend).

The model-wide keys the neuronx backend shares with the others stay in `handler:`
(`tp_degree`, `amp`, `n_positions`) and `micro_batching.micro_batch_size` is the compiled
batch size; everything only transformers-neuronx understands lives here.

`neuron_config` passes keywords through to transformers-neuronx's NeuronConfig, except
those this backend cannot honour (REFUSED_NEURON_CONFIG): it drives a static batch through
Hugging Face `generate`, left-padding each micro-batch and sending 1-D cache ids, and it
reads `[batch, vocab]` logits. A keyword that makes the SDK expect right-padded rows with
2-D cache ids, or return something else, would compile and run, and answer with corrupt
text; so it fails the start instead, naming the key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import PurePosixPath
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

GQA_SHARDING = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")
NEURON_CONFIG_KEY = "handler.neuronx.neuron_config"

Option = bool | int | float | str

_RIGHT_ALIGNED = (
    "it makes transformers-neuronx expect right-padded rows with 2-D cache ids (NeuronConfig.lhs_aligned), but this "
    "backend left-pads each static micro-batch and sends 1-D cache ids: the model would read the wrong KV "
    "positions and answer with corrupt text"
)
_CONTINUOUS_BATCHING = (
    "it turns on continuous batching (sequence slots, right padding, 2-D cache ids), which this backend's static, "
    "left-padded micro-batches cannot drive"
)
_NEEDS_LOGITS = "this backend samples through Hugging Face generate, which needs [batch, vocab] logits"
_OUTPUT_SHAPE = f"it changes what the model's forward() returns; {_NEEDS_LOGITS}"
_ON_DEVICE = f"it samples on the device, so forward() returns token ids; {_NEEDS_LOGITS}"
_EAGLE = f"it is EAGLE speculation, whose forward() also returns hidden states; {_NEEDS_LOGITS}"


def _truthy(value: Option) -> bool:
    return bool(value)


def _not_left(value: Option) -> bool:
    return value != "left"


# key -> (is the value refused?, why); the real NeuronConfig sets lhs_aligned from padding_side == 'right',
# then from the deprecated use_2d_cache_ids / lhs_aligned keywords, and forces it on with continuous batching.
REFUSED_NEURON_CONFIG: dict[str, tuple[Callable[[Option], bool], str]] = {
    "padding_side": (_not_left, _RIGHT_ALIGNED),
    "lhs_aligned": (_truthy, _RIGHT_ALIGNED),
    "use_2d_cache_ids": (_truthy, _RIGHT_ALIGNED),
    "continuous_batching": (_truthy, _CONTINUOUS_BATCHING),
    "batch_size_for_shared_caches": (lambda _value: True, _CONTINUOUS_BATCHING),
    "max_num_seqs": (lambda _value: True, _CONTINUOUS_BATCHING),
    "output_all_logits": (_truthy, _OUTPUT_SHAPE),
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


class NeuronxConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    model_class: str = Field(
        default="LlamaForSampling",
        description="a class under transformers_neuronx: 'LlamaForSampling', 'mistral.model.MistralForSampling', ...",
        min_length=1,
    )
    context_length_estimate: list[int] | None = Field(
        default=None,
        description="prompt (context encoding) buckets; default: powers of two from 128 up to n_positions",
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
            "more NeuronConfig keywords, e.g. {fuse_qkv: true}; unknown ones fail start, and so do those a static, "
            "left-padded micro-batch cannot honour (padding_side other than left, lhs_aligned, use_2d_cache_ids, "
            "continuous batching, output_all_logits, log_softmax_scores, on_device_generation, EAGLE)"
        ),
    )
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

    @field_validator("context_length_estimate")
    @classmethod
    def _buckets(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value or any(b < 1 for b in value):
            raise ValueError("must be a non-empty list of positive token counts, e.g. [128, 512, 1024]")
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

    @field_validator("compile_cache")
    @classmethod
    def _cache_url(cls, value: str | None) -> str | None:
        if value is None or value.startswith("s3://") or PurePosixPath(value).is_absolute():
            return value
        raise ValueError("must be an absolute local path (e.g. /tmp/neuron-compile-cache) or an s3:// URL")
