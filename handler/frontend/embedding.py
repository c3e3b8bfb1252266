"""An embedding archive (`handler.task: embed`) behind the ASGI frontend: the encoder loaded on a
thread after the server starts (`/ping` 503 until it serves), and TorchServe's classic batching
done here: the first request waits up to `maxBatchDelay` ms for company, at most `batchSize`
requests go together to one worker thread, which prepares each (handler/core/embedding.py), encodes
all their inputs together and answers each; a bad request fails alone."""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from handler.api.embeddings import FeatureExtractionApi
from handler.backends.encoder_base import SentenceEncoder
from handler.config import ServingConfig
from handler.core.embedding import EmbeddingCore, EmbeddingWork, error_answer, load_warm_encoder
from handler.errors import EngineError, ServiceUnavailable
from handler.frontend.loading import LoadedOnAThread
from handler.frontend.metrics import FrontendMetrics

logger = logging.getLogger(__name__)

DEFAULT_BATCH_DELAY_MS = 100  # TorchServe's maxBatchDelay default


@dataclass
class Answer:
    status: int
    body: str


@dataclass
class _Pending:
    route: str
    body: bytes
    request_id: str
    future: asyncio.Future[Answer] = field(repr=False)


class EmbeddingBatcher:
    """Concurrent requests gathered into batches on the event loop, each batch run on the encoder's one
    worker thread (the encoder and its tokenizer see one batch at a time, as in a TorchServe worker)."""

    def __init__(self, core: EmbeddingCore, model_name: str, batch_size: int, batch_delay_s: float) -> None:
        self.core = core
        self.model_name = model_name
        self.batch_size = batch_size
        self.batch_delay_s = batch_delay_s
        self.in_flight = 0  # requests submitted and not answered
        self._pending: list[_Pending] = []
        self._arrived = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="encoder")
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def submit(self, route: str, body: bytes, request_id: str) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(route, body, request_id, future))
        self._arrived.set()
        self.in_flight += 1
        try:
            return await future
        finally:
            self.in_flight -= 1

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._arrived.wait()
            deadline = loop.time() + self.batch_delay_s
            while len(self._pending) < self.batch_size and (left := deadline - loop.time()) > 0:
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), left)
                except asyncio.TimeoutError:
                    break
            batch, self._pending = self._pending[: self.batch_size], self._pending[self.batch_size :]
            if not self._pending:
                self._arrived.clear()
            batch = [p for p in batch if not p.future.done()]  # a request cancelled while it waited
            if not batch:
                continue
            answers = await loop.run_in_executor(self._executor, self.handle, batch)
            for pending, answer in zip(batch, answers, strict=True):
                if not pending.future.done():
                    pending.future.set_result(answer)

    def handle(self, batch: list[_Pending]) -> list[Answer]:
        """One batch on the worker thread: what TorchServe's adapter does with one handler call."""
        try:
            works = [
                self.core.prepare(EmbeddingWork(i, p.request_id), p.route, self.model_name, lambda p=p: p.body)
                for i, p in enumerate(batch)
            ]
            self.core.encode([w for w in works if w.encodes])
            return [self._answer(w) for w in works]
        except Exception:  # a bug: the batch fails, the server goes on
            logger.exception("an embedding batch failed")
            error = EngineError("embedding failed")
            return [Answer(error.status, FeatureExtractionApi().error(error)) for _ in batch]

    def _answer(self, work: EmbeddingWork) -> Answer:
        if work.error is not None:
            status, _, body = error_answer(work)
            return Answer(status, body)
        return Answer(200, self.core.body(work))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for pending in self._pending:
            if not pending.future.done():
                pending.future.set_exception(ServiceUnavailable("the server is stopping", "model"))
        self._executor.shutdown(wait=True)


class ServedEmbedder(LoadedOnAThread):
    """The ASGI frontend's model when model-config.yaml says `handler.task: embed` (the surface of
    handler/frontend/model.py's ServedModel that the app uses: ready, unavailable, gauges, close)."""

    def __init__(self, raw_config: dict[str, Any], model_dir: Path, model_name: str) -> None:
        super().__init__(ServingConfig.from_model_yaml(raw_config), model_dir)
        self.model_name = model_name
        delay_ms = raw_config.get("maxBatchDelay", DEFAULT_BATCH_DELAY_MS)
        self.batch_delay_s = float(delay_ms if isinstance(delay_ms, (int, float)) else DEFAULT_BATCH_DELAY_MS) / 1000
        self.encoder: SentenceEncoder | None = None
        self.batcher: EmbeddingBatcher | None = None

    @property
    def ready(self) -> bool:
        return self.batcher is not None

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.encoder = load_warm_encoder(self.config, str(self.model_dir))
        loop.call_soon_threadsafe(self._serve, EmbeddingCore(self.config, self.encoder))

    def _serve(self, core: EmbeddingCore) -> None:
        """On the event loop: the batcher's task belongs to it."""
        batcher = EmbeddingBatcher(core, self.model_name, self.config.batch_size, self.batch_delay_s)
        batcher.start()
        self.batcher = batcher
        logger.info("the ASGI frontend serves the encoder")

    def gauges(self, metrics: FrontendMetrics | None = None) -> dict[str, float]:
        out = {"llm_model_ready": 1.0 if self.ready else 0.0}
        if self.batcher is not None:
            out["llm_requests_in_flight"] = self.batcher.in_flight
        return out

    async def stop(self) -> None:
        if self.batcher is not None:
            await self.batcher.stop()

    def close(self) -> None:
        self._wait_for_loading()
        if self.encoder is not None:
            self.encoder.close()
