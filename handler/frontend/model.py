"""The generation model behind the ASGI frontend: loaded on a thread after the server starts
(handler/frontend/loading.py), then the engine and its bridge to the loop."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from handler.config import ServingConfig
from handler.core.engine_client import EngineClient
from handler.core.preparation import GenerationCore, load_model
from handler.engine.interface import Engine
from handler.errors import ConfigError
from handler.frontend.bridge import EngineBridge
from handler.frontend.loading import LoadedOnAThread
from handler.frontend.metrics import FrontendMetrics
from handler.frontend.threads import leave_a_core_to_the_loop
from handler.replicas.replica_set import Health, ReplicaSet

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
        self.client: EngineClient | None = None
        self.bridge: EngineBridge | None = None
        self.engine: Engine | None = None
        self.replicas: ReplicaSet | None = None  # with scheduler.replicas > 1: their health on /ping

    @property
    def ready(self) -> bool:
        return self.bridge is not None and self.failure is None

    def readiness(self) -> tuple[int, dict[str, str]]:
        """As TorchServe's plugin answers for a worker's replicas: 200 "Degraded" while some are
        down (restarting) and one serves, 503 "Unhealthy" while none does."""
        status, body = super().readiness()
        if status != 200 or self.replicas is None:
            return status, body
        health = self.replicas.health()
        if health.problem is None:
            return status, body
        if health.ready:
            return 200, {"status": "Degraded", "message": health.problem}
        return 503, {"status": "Unhealthy", "message": health.problem}

    def _replica_health(self, health: Health) -> None:
        """A replica went down, came back or gave up (from the replica set's threads). One that gave
        up fails the model, as the TorchServe worker fails (the engine client ended its requests):
        /ping is 503."""
        if health.failed is not None and self.failure is None and self.client is not None:
            self.failure = self.client.failure

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        leave_a_core_to_the_loop(self.config.handler.cpu_threads)
        core = GenerationCore(self.config, load_model(self.config, str(self.model_dir)), str(self.model_dir))
        client = EngineClient.build(core)
        client.on_health = self._replica_health
        client.start()
        bridge = EngineBridge(client, loop)
        bridge.start()
        self.core, self.client, self.engine, self.replicas = core, client, client.engine, client.replicas
        self.bridge = bridge
        logger.info("the ASGI frontend serves the model")

    def gauges(self, metrics: FrontendMetrics | None = None) -> dict[str, float]:
        """The values read at scrape time; the engine's step records since the last scrape, its slot
        gauges and the replicas' health go to `metrics` themselves."""
        engine, bridge = self.engine, self.bridge
        out = {"llm_model_ready": 1.0 if self.ready else 0.0}
        if engine is not None and bridge is not None:
            out |= {"llm_requests_in_flight": bridge.in_flight, "llm_engine_steps_total": engine.steps}
        if metrics is not None and engine is not None:
            metrics.engine_steps(engine.take_records(), engine.occupied, engine.waiting)
        if metrics is not None and self.replicas is not None:
            metrics.replicas(self.replicas.health())
        return out

    def close(self) -> None:
        self._wait_for_loading()
        if self.bridge is not None:
            self.bridge.stop()
        if self.client is not None:
            self.client.stop()
        if self.core is not None:
            self.core.close()
