"""Fake of the neuronx-cc compiler package: only its version, which transformers-neuronx
reads (`from neuronxcc import __version__`) and the artifact manifest records.
`FAKE_NEURONXCC_VERSION` lets a test pretend the compiler was upgraded."""

import os

__version__ = os.environ.get("FAKE_NEURONXCC_VERSION", "2.15.128.0+fake")
