"""Fake transformers-neuronx (tests only); see tests/fakes/README.md.

Mirrors src/transformers_neuronx/__init__.py of aws-neuron/transformers-neuronx."""

from transformers_neuronx.config import NeuronConfig, QuantizationConfig
from transformers_neuronx.constants import GQA, Layout
from transformers_neuronx.generation_utils import HuggingFaceGenerationModelAdapter
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling
from transformers_neuronx.version import __version__

__all__ = [
    "GQA",
    "HuggingFaceGenerationModelAdapter",
    "Layout",
    "LlamaForSampling",
    "MistralForSampling",
    "NeuronConfig",
    "QuantizationConfig",
    "__version__",
]
