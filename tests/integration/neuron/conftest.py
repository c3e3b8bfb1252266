"""The fake Neuron SDKs and the backends started on them (tests/support/neuron.py)."""

from tests.support.neuron import checkpoint, fake_neuronx, one_torch_thread, start_backend, start_handler

__all__ = ["checkpoint", "fake_neuronx", "one_torch_thread", "start_backend", "start_handler"]
