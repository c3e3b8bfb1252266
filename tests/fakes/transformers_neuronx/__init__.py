"""Fake transformers-neuronx (tests only); see tests/fakes/README.md.

Mirrors src/transformers_neuronx/__init__.py of aws-neuron/transformers-neuronx. Importing it
writes an `import` line to the call log (tests/fakes/README.md), so a test can tell a log
without a call from a log that was never written."""

from transformers_neuronx import _calllog
from transformers_neuronx.config import ContinuousBatchingConfig, NeuronConfig, QuantizationConfig
from transformers_neuronx.constants import GQA, Layout
from transformers_neuronx.llama.model import LlamaForSampling
from transformers_neuronx.mistral.model import MistralForSampling
from transformers_neuronx.version import __version__

__all__ = [
    "GQA",
    "ContinuousBatchingConfig",
    "Layout",
    "LlamaForSampling",
    "MistralForSampling",
    "NeuronConfig",
    "QuantizationConfig",
    "__version__",
]

_calllog.record("import", version=__version__)
