"""The model behind the ASGI frontend: loaded on a thread after the server starts (so `/ping`
answers 503 while it loads, 200 once it serves), then the engine and its bridge to the loop."""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Any

from handler.config import ServingConfig
from handler.core.preparation import GenerationCore, load_model
from handler.engine.interface import Engine
from handler.engine.step_engine import StepEngine
from handler.errors import ConfigError, ServiceUnavailable
from handler.frontend.bridge import EngineBridge
from handler.frontend.metrics import FrontendMetrics
from handler.replicas.model import ReplicatedModel

logger = logging.getLogger(__name__)

# As TorchServe's frontend: job_queue_size's default where model-config.yaml sets no jobQueueSize.
DEFAULT_JOB_QUEUE = 100


class ServedModel:
    def __init__(self, raw_config: dict[str, Any], model_dir: Path) -> None:
        self.config = ServingConfig.from_model_yaml(raw_config)
        if self.config.handler.task != "generate":
            raise ConfigError("ServedModel serves handler.task generate; embed is handler/frontend/embedding.py's")
        if self.config.scheduler.mode != "continuous":
            raise ConfigError(
                "the ASGI frontend runs the step engine: scheduler.mode must be continuous (static is TorchServe's "
                "micro-batching)"
            )
        self.model_dir = model_dir
        # Requests in flight before a fast 503, as TorchServe bounds them: batchSize in the worker plus
        # jobQueueSize queued in front of it (docs/configuration.md); an unbounded queue turns overload
        # into timeouts.
        self.max_in_flight = self.config.batch_size + (self.config.job_queue_size or DEFAULT_JOB_QUEUE)
        self.core: GenerationCore | None = None
        self.bridge: EngineBridge | None = None
        self.engine: Engine | None = None
        self.failure: str | None = None
        self._thread: threading.Thread | None = None

    @property
    def ready(self) -> bool:
        return self.bridge is not None

    def unavailable(self) -> ServiceUnavailable:
        if self.failure is not None:
            return ServiceUnavailable(f"the model failed to load: {self.failure}", "model")
        return ServiceUnavailable("the model is still loading; retry shortly", "model")

    def start_loading(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(target=self._load, args=(loop,), name="model-load", daemon=True)
        self._thread.start()

    def _load(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            backend = load_model(self.config, str(self.model_dir))
            core = GenerationCore(self.config, backend)
            settings = self.config.scheduler
            if isinstance(backend, ReplicatedModel):
                engine: Engine = backend.replicas
            else:  # the request is submitted when it arrives: no frontend round trip to hold a step for
                engine = StepEngine(backend, settings.prefill_token_budget, admission_wait=0.0)
            engine.start()
            bridge = EngineBridge(engine, loop)
            bridge.start()
            self.core, self.engine, self.bridge = core, engine, bridge
            logger.info("the ASGI frontend serves the model")
        except Exception as exc:
            logger.exception("loading the model failed")
            self.failure = f"{type(exc).__name__}: {exc}"

    def gauges(self, metrics: FrontendMetrics | None = None) -> dict[str, float]:
        """The gauges at scrape time; the engine's step records since the last scrape go to `metrics`."""
        engine, bridge = self.engine, self.bridge
        if engine is not None and metrics is not None:
            metrics.engine_steps(engine.take_records())
        out = {"llm_model_ready": 1.0 if self.ready else 0.0}
        if engine is not None and bridge is not None:
            out |= {
                "llm_slots_occupied": engine.occupied,
                "llm_requests_waiting": engine.waiting,
                "llm_requests_in_flight": bridge.in_flight,
                "llm_engine_steps_total": engine.steps,
            }
        return out

    def close(self) -> None:
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self.bridge is not None:
            self.bridge.stop()
        if self.engine is not None:
            self.engine.stop()
        if self.core is not None:
            self.core.close()
