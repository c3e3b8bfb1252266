"""Mirrors LlamaForSampling (src/transformers_neuronx/llama/model.py): same constructor
keywords and defaults; unknown keywords are swallowed, as the real one does; like it,
`sequence_parallel_norm` with a context bucket above the threshold that tp_degree does not
divide raises ValueError."""

from __future__ import annotations

from typing import Any

from transformers_neuronx.base import NeuronModelBase


class LlamaForSampling(NeuronModelBase):
    def __init__(
        self,
        config: Any,
        *,
        n_positions: int | list[int] = 2048,
        batch_size: int = 1,
        amp: str = "f32",
        tp_degree: int = 2,
        context_length_estimate: int | list[int] | None = None,
        context_unroll: int | None = None,
        unroll: int | None = None,
        neuron_config: Any = None,
        prefixed_length: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            config,
            n_positions=n_positions,
            batch_size=batch_size,
            amp=amp,
            tp_degree=tp_degree,
            context_length_estimate=context_length_estimate,
            neuron_config=neuron_config,
        )
        if neuron_config and neuron_config.sequence_parallel_norm:
            for bucket_size in self.context_buckets:
                if bucket_size > neuron_config.sequence_parallel_norm_threshold and bucket_size % tp_degree != 0:
                    raise ValueError(
                        f"Sequence parallel normalization requires the bucket size ({bucket_size}) to be divisible "
                        f"by the tensor parallel degree ({tp_degree})"
                    )
