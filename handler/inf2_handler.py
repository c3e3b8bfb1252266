"""TorchServe entry point (`torch-model-archiver --handler handler/inf2_handler.py`).

The archiver copies this file to the archive root, next to the `handler/` package,
and TorchServe puts the archive root on sys.path, so `import handler...` works.

A thin adapter: by `scheduler.mode`, TorchServe's calls go to the continuous-batching
engine (handler/serving/continuous.py, `continuousBatching: true`) or to the static
micro-batching path (handler/serving/static.py); an embedding archive (`handler.task: embed`)
goes to handler/serving/embedding.py. The logic lives in those modules.
"""

from __future__ import annotations

import logging
import os
import sys

# Models load from local directories only; never reach for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The archive's own Python dependencies, bundled by `make sagemaker-archive` for the DLC's
# Python (deps/cp310 for neuronx, deps/cp312 for nxdi): endpoints without internet cannot pip
# install at load. First on the path, so they win over whatever the image ships; on any other
# Python the venv's are used.
_BUNDLED_DEPS = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "deps", f"cp{sys.version_info[0]}{sys.version_info[1]}"
)
if os.path.isdir(_BUNDLED_DEPS) and _BUNDLED_DEPS not in sys.path:
    sys.path.insert(0, _BUNDLED_DEPS)

from ts.torch_handler.base_handler import BaseHandler

from handler.config import ServingConfig
from handler.serving.init_failure import FailedServing
from handler.serving.replies import encodable
from handler.serving.service import GenerationService

logger = logging.getLogger(__name__)


class Inf2StreamingHandler(BaseHandler):
    def __init__(self) -> None:
        super().__init__()
        # ContinuousServing or StaticServing by scheduler.mode, EmbeddingServing by handler.task; FailedServing if
        # loading failed
        self.serving = None

    def initialize(self, context) -> None:
        self.context = context
        try:
            self.serving = _start_serving(context)
        except Exception as exc:  # answer requests fast instead of letting them queue: handler/serving/init_failure.py
            self.serving = FailedServing.start(exc, context)
        self.initialized = True

    def handle(self, data, context):
        """TorchServe's entry point (bound before initialize(), so it dispatches)."""
        return encodable(self.serving.handle(data, context))

    def shutdown(self) -> None:
        """Stop the engine's or MicroBatching's threads and release the model."""
        if self.serving is not None:
            self.serving.shutdown()
            service = getattr(self.serving, "service", None)  # none in the failed state
            if service is not None:
                service.close()


def _start_serving(context):
    """Load the model and start the serving `handler.task` and `scheduler.mode` name."""
    config = ServingConfig.from_model_yaml(context.model_yaml_config)
    if config.handler.task == "embed":
        from handler.serving.embedding import EmbeddingServing

        return EmbeddingServing.start(config, context)
    service = GenerationService.from_context(context)
    try:
        if service.config.scheduler.mode == "continuous":
            from handler.serving.continuous import ContinuousServing

            return ContinuousServing(service)
        from handler.serving.static import StaticServing

        return StaticServing(service, context)
    except BaseException:
        service.close()
        raise
