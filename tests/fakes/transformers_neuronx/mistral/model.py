"""Mirrors MistralForSampling (src/transformers_neuronx/mistral/model.py)."""

from __future__ import annotations

from typing import Any

from transformers_neuronx.base import NeuronModelBase


class MistralForSampling(NeuronModelBase):
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
