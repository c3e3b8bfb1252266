"""Mirrors the public classes of src/neuronx_distributed_inference/models/qwen2/
modeling_qwen2.py (NxDI 0.8.16251, SDK 2.28 commit cd3abf3): Qwen2NeuronConfig (sets
attn_cls = NeuronQwen2Attention), Qwen2InferenceConfig (num_cores_per_group 1,
qkv_bias True, o_bias False; requires the Llama list of attributes) and
NeuronQwen2ForCausalLM (get_config_cls -> Qwen2InferenceConfig, load_hf_model ->
Qwen2ForCausalLM.from_pretrained, its own compiler args). Like the real tree at that
commit, the qwen2 folder has no __init__.py (a namespace package: importable all the same).
The fake serves model_type "qwen2" only.
"""

from __future__ import annotations

from typing import Any, ClassVar

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class NeuronQwen2Attention:
    """Name only: what Qwen2NeuronConfig.attn_cls points at."""


class Qwen2NeuronConfig(NeuronConfig):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.attn_cls = NeuronQwen2Attention


class Qwen2InferenceConfig(InferenceConfig):
    def add_derived_config(self) -> None:
        self.num_cores_per_group = 1
        self.qkv_bias = True
        self.o_bias = False

    def get_required_attributes(self) -> list[str]:
        return [
            "hidden_size",
            "num_attention_heads",
            "num_hidden_layers",
            "num_key_value_heads",
            "pad_token_id",
            "vocab_size",
            "max_position_embeddings",
            "rope_theta",
            "rms_norm_eps",
            "hidden_act",
        ]

    @classmethod
    def get_neuron_config_cls(cls) -> type[Qwen2NeuronConfig]:
        return Qwen2NeuronConfig


class NeuronQwen2Model(NeuronBaseModel):
    pass


class NeuronQwen2ForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronQwen2Model
    _fake_model_types: ClassVar[tuple[str, ...] | None] = ("qwen2",)

    @staticmethod
    def load_hf_model(model_path: str, **kwargs: Any) -> Any:
        from transformers import Qwen2ForCausalLM

        return Qwen2ForCausalLM.from_pretrained(model_path, **kwargs)

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        return Qwen2InferenceConfig

    def get_compiler_args(self) -> str:
        return (
            "--enable-saturate-infinity --enable-mixed-precision-accumulation --auto-cast=none "
            "--model-type transformer -O1 --tensorizer-options='--enable-ccop-compute-overlap "
            "--cc-pipeline-tiling-factor=2 --vectorize-strided-dma' "
            "--internal-hlo2tensorizer-options='--verify-hlo=true'"
        )
