"""The fake Neuron SDKs for the real-TorchServe runs of the Neuron backends (tests/support/neuron.py)."""

from tests.support.neuron import checkpoint, fake_neuronx, one_torch_thread

__all__ = ["checkpoint", "fake_neuronx", "one_torch_thread"]
