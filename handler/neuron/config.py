"""The `handler.neuronx:` section of model-config.yaml (read only by the neuronx backend).

The model-wide keys the neuronx backend shares with the others stay in `handler:`
(`tp_degree`, `amp`, `n_positions`) and `micro_batching.micro_batch_size` is the compiled
batch size; everything only transformers-neuronx understands lives here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

GQA_SHARDING = ("shard-over-heads", "shard-over-batch", "replicated-heads", "all-gather-heads")


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
    neuron_config: dict[str, bool | int | float | str] = Field(
        default_factory=dict, description="more NeuronConfig keywords, e.g. {fuse_qkv: true}; unknown ones fail start"
    )
    compiler_flags: list[str] = Field(default_factory=list, description="extra neuronx-cc flags for NEURON_CC_FLAGS")
    cache_dir: str = Field(
        default="neuron_cache",
        min_length=1,
        description="compiled artifacts + compile cache: relative to the checkpoint, absolute (shared disk) or s3://",
    )
    num_cores: int | None = Field(
        default=None, ge=1, le=128, description="NeuronCores this server may use; default: counted from /dev/neuron*"
    )
    compile_on_start: bool = Field(
        default=True, description="false: a start without matching artifacts fails instead of compiling for minutes"
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
