"""Mirrors the public classes of src/neuronx_distributed_inference/models/llama/
modeling_llama.py (NxDI 0.8.16251, SDK 2.28 commit cd3abf3): LlamaInferenceConfig and
NeuronLlamaForCausalLM (plus NeuronLlamaModel / NeuronLlamaAttention names).

- LlamaInferenceConfig requires hidden_size, num_attention_heads, num_hidden_layers,
  num_key_value_heads, pad_token_id, vocab_size, max_position_embeddings, rope_theta,
  rms_norm_eps, hidden_act (AssertionError "Config must define [...]" otherwise); its
  neuron config class is NeuronConfig; padded_hidden_size replaces hidden_size.
- NeuronLlamaForCausalLM.get_config_cls() is LlamaInferenceConfig; load_hf_model(path)
  is LlamaForCausalLM.from_pretrained(path).
- SDK 2.28 has no models/mistral package (it appears in the 2.29 sync): Mistral
  checkpoints go through NeuronLlamaForCausalLM, as vLLM's Neuron loader maps
  MistralForCausalLM. The fake lets this class serve model_type "llama" and "mistral"
  and refuses others (a Qwen checkpoint has q/k/v biases or q/k norms Llama would drop).
"""

from __future__ import annotations

from typing import Any, ClassVar

from transformers import LlamaForCausalLM

from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig
from neuronx_distributed_inference.models.model_base import NeuronBaseForCausalLM, NeuronBaseModel


class NeuronLlamaAttention:
    """Name only: the attention class NeuronConfig.attn_cls names."""


class LlamaInferenceConfig(InferenceConfig):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.neuron_config.padded_hidden_size is not None and not hasattr(self, "original_hidden_size"):
            self.original_hidden_size = self.hidden_size
        if self.neuron_config.padded_hidden_size is not None:
            self.hidden_size = self.neuron_config.padded_hidden_size

    def add_derived_config(self) -> None:
        self.num_cores_per_group = 1
        if self.neuron_config.flash_decoding_enabled:
            raise NotImplementedError("fake NxD Inference: flash decoding is not modelled")

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
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return NeuronConfig


class NeuronLlamaModel(NeuronBaseModel):
    pass


class NeuronLlamaForCausalLM(NeuronBaseForCausalLM):
    _model_cls = NeuronLlamaModel
    _fake_model_types: ClassVar[tuple[str, ...] | None] = ("llama", "mistral")

    @staticmethod
    def load_hf_model(model_path: str, **kwargs: Any) -> Any:
        return LlamaForCausalLM.from_pretrained(model_path, **kwargs)

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        return LlamaInferenceConfig
