"""Mirrors src/neuronx_distributed_inference/modules/lora_serving/__init__.py (NxDI 0.8.16251, SDK 2.28
commit cd3abf3): the package's exports, less `wrap_model_with_lora` and `is_lora_module`, which act on
torch modules the fake does not build (the fake's injected modules: lora_model.fake_lora_modules)."""

from neuronx_distributed_inference.modules.lora_serving.config import LoraServingConfig
from neuronx_distributed_inference.modules.lora_serving.lora_checkpoint import LoraCheckpoint
from neuronx_distributed_inference.modules.lora_serving.lora_model import LoraModelManager, LoraWeightManager

__all__ = ["LoraCheckpoint", "LoraModelManager", "LoraServingConfig", "LoraWeightManager"]
