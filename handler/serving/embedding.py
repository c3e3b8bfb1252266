"""`handler.task: embed`: an embedding archive on TorchServe's classic batching, a static-style adapter.

TorchServe hands over a batch of requests (`batchSize`, `maxBatchDelay`); each request may carry many
inputs. One `handle` call (the steps are handler/core/embedding.py, shared with the ASGI frontend):
prepare:  body -> route (handler/api: OpenAI, feature extraction, model listing) -> validated
          request -> token ids per input, each checked against the vocabulary and the model's
          maximum length (or the error that request alone gets)
encode:   every good request's inputs together, sorted by length and run in groups of
          `handler.embed.encode_batch_size` (padded within a group), then handed back per request
finish:   each request's body in its route's format, or its 4xx; the model listing answered as is

Nothing escapes `handle()`: an exception there would answer 503 to the whole batch.

Draining (handler/serving/drain.py, `make stop`): new requests get a 503 in their route's format;
a batch is short, so the one in flight simply finishes, and the worker marks itself drained once
idle for maxBatchDelay (the frontend may still hand it what queued meanwhile).
"""

from __future__ import annotations

import logging
from typing import Any

from handler.api.embeddings import FeatureExtractionApi
from handler.backends.encoder_base import SentenceEncoder
from handler.config import ServingConfig
from handler.core.embedding import EmbeddingCore, EmbeddingWork, load_warm_encoder
from handler.errors import EngineError
from handler.serving import drain
from handler.serving.grpc_jobs import end_grpc_reply, is_grpc
from handler.serving.intake_checks import check_body_form
from handler.serving.replies import error_reply
from handler.serving.service import body_of, worker_of
from handler.serving.static import batch_delay_s

logger = logging.getLogger(__name__)

__all__ = ["EmbeddingServing", "EmbeddingWork"]


class EmbeddingServing:
    def __init__(self, config: ServingConfig, encoder: SentenceEncoder, batch_delay_s: float = 0.1) -> None:
        self.config = config
        self.encoder = encoder
        self.core = EmbeddingCore(config, encoder)
        self._calls = 0  # handle() calls running
        self.drain = drain.DrainWatcher.from_env(lambda: self._calls > 0, settle_s=batch_delay_s + 0.2)
        self.drain.start()

    @classmethod
    def start(cls, config: ServingConfig, context: Any) -> EmbeddingServing:
        encoder = load_warm_encoder(config, context.system_properties.get("model_dir"), *worker_of(context))
        return cls(config, encoder, batch_delay_s(context))

    def handle(self, data: list[Any], context: Any) -> list[str]:
        self._calls += 1
        try:
            works = [self._prepare(index, row, context) for index, row in enumerate(data)]
            self.core.encode([w for w in works if w.encodes])
            return [self._finish(w, context) for w in works]
        except Exception:  # never let one escape: TorchServe would answer 503 to the whole batch
            logger.exception("an embedding batch failed")
            error = EngineError("embedding failed")
            return [error_reply(context, i, FeatureExtractionApi(), error) for i in range(len(data))]
        finally:
            self._calls -= 1

    # -- prepare (handler/core/embedding.py, with TorchServe's body form, gRPC and drain) ---------

    def _prepare(self, index: int, row: Any, context: Any) -> EmbeddingWork:
        work = EmbeddingWork(index, context.get_request_id(index) or str(index), FeatureExtractionApi())
        work.grpc = is_grpc(context, index, row)
        return self.core.prepare(
            work,
            context.get_request_header(index, "url_path"),
            context.model_name,
            lambda: body_of(row),
            refusal=lambda: drain.refused() if self.drain.draining else None,
            intake=lambda: check_body_form(context, index),
        )

    # -- finish -------------------------------------------------------------------------

    def _finish(self, work: EmbeddingWork, context: Any) -> str:
        if work.grpc:  # one reply, the last (handler/serving/grpc_jobs.py)
            end_grpc_reply(context, work.index)
        if work.error is not None:
            logger.info("request %s failed: %s %s", work.request_id, work.error.status, work.error.message)
            return error_reply(context, work.index, work.api, work.error)
        context.set_response_content_type(work.index, "application/json")
        return self.core.body(work)

    def shutdown(self) -> None:
        self.drain.stop()
        self.encoder.close()
