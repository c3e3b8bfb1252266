"""Mirrors the public classes of src/neuronx_distributed_inference/models/qwen3/
modeling_qwen3.py (NxDI 0.8.16251, SDK 2.28 commit cd3abf3): Qwen3NeuronConfig (sets
attn_cls = NeuronQwen3Attention), Qwen3InferenceConfig (num_cores_per_group 1; requires the
Llama list plus head_dim) and NeuronQwen3ForCausalLM (get_config_cls ->
Qwen3InferenceConfig, load_hf_model -> Qwen3ForCausalLM.from_pretrained). The fake serves
model_type "qwen3" only.
"""

from __future__ import annotations

from typing import Any, ClassVar

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class NeuronQwen3Attention:
    """Name only: what Qwen3NeuronConfig.attn_cls points at."""


class Qwen3NeuronConfig(NeuronConfig):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attn_cls = NeuronQwen3Attention


class Qwen3InferenceConfig(InferenceConfig):
    def add_derived_config(self) -> None:
        self.num_cores_per_group = 1

    def get_required_attributes(self) -> list[str]:
        return [
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "num_key_value_heads",
            "head_dim",
            "pad_token_id",
            "vocab_size",
            "max_position_embeddings",
            "rope_theta",
            "rms_norm_eps",
            "hidden_act",
        ]

    @classmethod
    def get_neuron_config_cls(cls) -> type[Qwen3NeuronConfig]:
        return Qwen3NeuronConfig


class NeuronQwen3Model(NeuronBaseModel):
    pass


class NeuronQwen3ForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronQwen3Model
    _fake_model_types: ClassVar[tuple[str, ...] | None] = ("qwen3",)

    @staticmethod
    def load_hf_model(model_path: str, **kwargs: Any) -> Any:
        from transformers import Qwen3ForCausalLM

        return Qwen3ForCausalLM.from_pretrained(model_path, **kwargs)

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        return Qwen3InferenceConfig
