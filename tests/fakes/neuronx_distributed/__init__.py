"""Fake of neuronx-distributed (NxD), tests only; see tests/fakes/README.md (NxD Inference).

SDK 2.28 ships NxD 0.17.26814 (aws-neuron/neuronx-distributed tag v2.28.0). The real
package's __init__.py exports no `__version__` (only `neuronx_distributed._version` holds
"0.17.0", the source version; the wheel's metadata carries the build number), so on a real
install only `importlib.metadata.version("neuronx-distributed")` gives 0.17.26814. This fake
has no distribution metadata, so it offers `__version__` (a fake-only attribute) for a
manifest's fallback; `FAKE_NXD_VERSION` lets a test pretend another release.

`neuronx_distributed.trace.model_builder.ModelBuilder` is the one piece with behaviour: the
compiler scratch directory that `trace()` wipes first (see that module).
"""

import os

__version__ = os.environ.get("FAKE_NXD_VERSION", "0.17.26814+fake")
