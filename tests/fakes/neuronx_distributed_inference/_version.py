"""Mirrors src/neuronx_distributed_inference/_version.py, with the SDK 2.28 build number.

The real file at the SDK 2.28 commit (cd3abf3, "Neuron SDK Release 2.28.0") says "0.8.0": the
wheel's metadata carries 0.8.16251 (setup.py takes the patch from VERSION_PATCH), the
module's `__version__` does not. On a real install ask `importlib.metadata` first; the fake
has no distribution metadata, so its `__version__` carries the full version for a
manifest's fallback. `FAKE_NXDI_VERSION` lets a test pretend another release.
"""

import os

__version__ = os.environ.get("FAKE_NXDI_VERSION", "0.8.16251+fake")
