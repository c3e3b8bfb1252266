"""TorchServe entry point (`torch-model-archiver --handler handler/inf2_handler.py`).

The archiver copies this file to the archive root, next to the `handler/` package,
and TorchServe puts the archive root on sys.path, so `import handler...` works.

A thin adapter: TorchServe hands over a batch; `MicroBatching` splits it into
micro-batches and runs our preprocess / inference / postprocess on its threads;
the logic lives in the modules imported below.
"""

from __future__ import annotations

import logging
import os
import sys

# Models load from local directories only; never reach for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The archive's own Python dependencies, bundled by `make sagemaker-archive` for the DLC's
# Python (deps/cp310): endpoints without internet cannot pip install at load. First on the
# path, so they win over whatever the image ships; on any other Python the venv's are used.
_BUNDLED_DEPS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "deps", f"cp{sys.version_info[0]}{sys.version_info[1]}"
)
if os.path.isdir(_BUNDLED_DEPS) and _BUNDLED_DEPS not in sys.path:
    sys.path.insert(0, _BUNDLED_DEPS)

from ts.torch_handler.base_handler import BaseHandler

from handler.batching import IndexedMicroBatching
from handler.service import GenerationService

logger = logging.getLogger(__name__)


class Inf2StreamingHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        self.service: GenerationService | None = None
        # TorchServe reads `handle` before initialize(); sizes are set there.
        self.handle = IndexedMicroBatching(self)

    def initialize(self, context) -> None:
        self.context = context
        self.service = GenerationService.from_context(context)
        micro = self.service.config.micro_batching
        self.handle.micro_batch_size = micro.micro_batch_size
        self.handle.parallelism = micro.parallelism.model_dump()
        self.initialized = True

    def preprocess(self, indexed_rows):
        return self.service.prepare(indexed_rows, self.context)

    def inference(self, work, *args, **kwargs):
        return self.service.generate(work, self.context)

    def postprocess(self, work):
        return self.service.finish(work, self.context)

    def shutdown(self) -> None:
        """Stop MicroBatching's threads (they are not daemons) and release the model."""
        self.handle.shutdown()
        if self.service is not None:
            self.service.close()
