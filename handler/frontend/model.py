"""The generation model behind the ASGI frontend: loaded on a thread after the server starts
(handler/frontend/loading.py), then the engine and its bridge to the loop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from handler.config import ServingConfig
from handler.core.preparation import GenerationCore, load_model
from handler.engine.interface import Engine
from handler.engine.step_engine import StepEngine
from handler.errors import ConfigError
from handler.frontend.bridge import EngineBridge
from handler.frontend.loading import LoadedOnAThread
from handler.frontend.metrics import FrontendMetrics
from handler.replicas.model import ReplicatedModel

logger = logging.getLogger(__name__)


class ServedModel(LoadedOnAThread):
    def __init__(self, raw_config: dict[str, Any], model_dir: Path) -> None:
        config = ServingConfig.from_model_yaml(raw_config)
        if config.handler.task != "generate":
            raise ConfigError("ServedModel serves handler.task generate; embed is handler/frontend/embedding.py's")
        if config.scheduler.mode != "continuous":
            raise ConfigError(
                "the ASGI frontend runs the step engine: scheduler.mode must be continuous (static is TorchServe's "
                "micro-batching)"
            )
        super().__init__(config, model_dir)
        self.core: GenerationCore | None = None
        self.bridge: EngineBridge | None = None
        self.engine: Engine | None = None

    @property
    def ready(self) -> bool:
        return self.bridge is not None

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
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
        self._wait_for_loading()
        if self.bridge is not None:
            self.bridge.stop()
        if self.engine is not None:
            self.engine.stop()
        if self.core is not None:
            self.core.close()
