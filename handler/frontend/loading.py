"""What both models behind the ASGI frontend share: loaded on a thread after the server starts (so
`/ping` answers 503 while it loads, with the cause if it failed), and TorchServe's bound on the
requests in flight."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from handler.config import ServingConfig
from handler.errors import ServiceUnavailable

logger = logging.getLogger(__name__)

# As TorchServe's frontend: job_queue_size's default where model-config.yaml sets no jobQueueSize.
DEFAULT_JOB_QUEUE = 100


class LoadedOnAThread:
    """The subclass's `_start(loop)` loads the model and starts serving (on the loading thread);
    `ready` says when it serves."""

    def __init__(self, config: ServingConfig, model_dir: Path) -> None:
        self.config = config
        self.model_dir = model_dir
        # Requests in flight before a fast 503, as TorchServe bounds them: batchSize in the worker plus
        # jobQueueSize queued in front of it (docs/configuration.md); an unbounded queue turns overload
        # into timeouts.
        self.max_in_flight = config.batch_size + (config.job_queue_size or DEFAULT_JOB_QUEUE)
        self.failure: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        raise NotImplementedError

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        raise NotImplementedError

    def unavailable(self) -> ServiceUnavailable:
        if self.failure is not None:
            return ServiceUnavailable(f"the model failed to load: {self.failure}", "model")
        return ServiceUnavailable("the model is still loading; retry shortly", "model")

    def readiness(self) -> tuple[int, dict[str, str]]:
        """/ping's status and body, in the shape TorchServe's readiness plugin gives them
        (serving/plugins: `{"status": ..., "message": ...}`), so a health checker reads both
        frontends alike."""
        if self.failure is not None:
            return 503, {"status": "Unhealthy", "message": self.unavailable().message}
        if not self.ready:
            return 503, {"status": "Loading", "message": self.unavailable().message}
        return 200, {"status": "Healthy"}

    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._load, args=(loop,), name="model-load", daemon=True)
        self._thread.start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._start(loop)
        except Exception as exc:
            logger.exception("loading the model failed")
            self.failure = f"{type(exc).__name__}: {exc}"

    def _wait_for_loading(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=60)
