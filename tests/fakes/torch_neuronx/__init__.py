"""Fake of torch-neuronx (tests only; see tests/fakes/README.md, sections NxD Inference and torch-neuronx).

What NxD Inference and the backends' manifests read: `__version__` (SDK 2.28 ships torch-neuronx
2.9.0.2.12.22436; NxD's ModelBuilder asserts it starts with "2") and
`torch_neuronx.utils.get_platform_target()`; what the encoder backend uses: `trace` (_trace.py) and
`DataParallel` (_data_parallel.py), from the SDK's API reference (api-torch-neuronx-trace.rst,
api-torch-neuronx-data-parallel.rst). torch-neuronx's source is not public, so the surface is taken
from its documentation and its callers (neuronx_distributed/trace/model_builder.py and
neuronx_distributed_inference/models/config.py at the SDK 2.28 tags).

`importlib.metadata` finds no distribution for this fake: a caller must fall back to
`__version__`. `FAKE_TORCH_NEURONX_VERSION` lets a test pretend another release.
"""

import os

from torch_neuronx._data_parallel import DataParallel
from torch_neuronx._trace import trace

__version__ = os.environ.get("FAKE_TORCH_NEURONX_VERSION", "2.9.0.2.12.22436+fake")
__all__ = ["DataParallel", "trace"]
