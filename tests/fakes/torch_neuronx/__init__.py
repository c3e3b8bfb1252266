"""Fake of torch-neuronx (tests only; see tests/fakes/README.md, section NxD Inference).

Only what NxD Inference and the backend's manifest read: `__version__` (SDK 2.28 ships
torch-neuronx 2.9.0.2.12.22436; NxD's ModelBuilder asserts it starts with "2") and
`torch_neuronx.utils.get_platform_target()`. torch-neuronx's source is not public, so the
surface is taken from its callers (neuronx_distributed/trace/model_builder.py and
neuronx_distributed_inference/models/config.py at the SDK 2.28 tags).

`importlib.metadata` finds no distribution for this fake: a caller must fall back to
`__version__`. `FAKE_TORCH_NEURONX_VERSION` lets a test pretend another release.
"""

import os

__version__ = os.environ.get("FAKE_TORCH_NEURONX_VERSION", "2.9.0.2.12.22436+fake")
