"""Fake NxD Inference (neuronx-distributed-inference), tests only; see tests/fakes/README.md,
section "NxD Inference".

Mirrors aws-neuron/neuronx-distributed-inference at the SDK 2.28 release commit cd3abf3
("Neuron SDK Release 2.28.0 - Component Release", NxDI 0.8.16251; the repository has no tag
for it: its tags stop at v0.7.14366). Like the real __init__.py it only exports
`__version__`. Importing it writes an `import` line to the call log.
"""

from neuronx_distributed_inference import _calllog
from neuronx_distributed_inference._version import __version__

__all__ = ["__version__"]

_calllog.record("import", version=__version__)
