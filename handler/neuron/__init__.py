"""Inferentia2 support that does not need transformers-neuronx to import: configuration,
the Neuron environment (compiler flags, compile cache), the compiled-artifact manifest
and NeuronCore placement. The backend itself is handler/backends/neuronx.py."""
