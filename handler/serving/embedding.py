"""`handler.task: embed`: an embedding archive on TorchServe's classic batching, a static-style adapter.

TorchServe hands over a batch of requests (`batchSize`, `maxBatchDelay`); each request may carry many
inputs. One `handle` call:
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
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handler.api import route_path, select_embedding_api
from handler.api.common import decode_body
from handler.api.embedding_schemas import EmbeddingRequest
from handler.api.embeddings import EmbeddingApi, FeatureExtractionApi
from handler.api.json_tree import printable
from handler.api.openai import ModelsApi
from handler.backends.encoder_base import SentenceEncoder
from handler.backends.loader import load_encoder
from handler.config import ServingConfig
from handler.errors import EngineError, InvalidRequest, ServingError
from handler.serving import drain
from handler.serving.grpc_jobs import end_grpc_reply, is_grpc
from handler.serving.intake_checks import check_body_form, fewest_tokens, longest_token_chars
from handler.serving.replies import error_reply
from handler.serving.service import body_of, worker_of
from handler.serving.static import batch_delay_s

logger = logging.getLogger(__name__)


@dataclass
class EmbeddingWork:
    """One request of a TorchServe batch."""

    index: int
    request_id: str
    api: EmbeddingApi | ModelsApi
    request: EmbeddingRequest | None = None
    token_ids: list[list[int]] = field(default_factory=list)
    vectors: np.ndarray | None = None
    error: ServingError | None = None
    reply: str | None = None  # answered without the model (the model listing)
    grpc: bool = False


class EmbeddingServing:
    def __init__(self, config: ServingConfig, encoder: SentenceEncoder, batch_delay_s: float = 0.1) -> None:
        self.config = config
        self.encoder = encoder
        self._longest_token_chars = longest_token_chars(encoder.tokenizer)
        self._calls = 0  # handle() calls running
        self.drain = drain.DrainWatcher.from_env(lambda: self._calls > 0, settle_s=batch_delay_s + 0.2)
        self.drain.start()

    @classmethod
    def start(cls, config: ServingConfig, context: Any) -> EmbeddingServing:
        started = time.perf_counter()
        encoder = load_encoder(config, context.system_properties.get("model_dir"), *worker_of(context))
        try:
            encoder.warmup()
        except BaseException:
            encoder.close()
            raise
        logger.info(
            "encoder %s ready in %.1f s (dimension=%d, max_length=%d, task=embed)",
            encoder.name,
            time.perf_counter() - started,
            encoder.dimension,
            encoder.max_length,
        )
        return cls(config, encoder, batch_delay_s(context))

    def handle(self, data: list[Any], context: Any) -> list[str]:
        self._calls += 1
        try:
            works = [self._prepare(index, row, context) for index, row in enumerate(data)]
            self._encode([w for w in works if w.error is None and w.reply is None])
            return [self._finish(w, context) for w in works]
        except Exception:  # never let one escape: TorchServe would answer 503 to the whole batch
            logger.exception("an embedding batch failed")
            error = EngineError("embedding failed")
            return [error_reply(context, i, FeatureExtractionApi(), error) for i in range(len(data))]
        finally:
            self._calls -= 1

    # -- prepare ------------------------------------------------------------------------

    def _prepare(self, index: int, row: Any, context: Any) -> EmbeddingWork:
        work = EmbeddingWork(index, context.get_request_id(index) or str(index), FeatureExtractionApi())
        work.grpc = is_grpc(context, index, row)
        try:
            check_body_form(context, index)
            url_path = context.get_request_header(index, "url_path")
            depth = self.config.handler.max_json_depth
            body = None if route_path(url_path) else decode_body(body_of(row), depth)
            work.api = select_embedding_api(url_path, context.model_name, self.encoder.dimension, body)
            if self.drain.draining:
                raise drain.refused()
            if isinstance(work.api, ModelsApi):
                work.reply = work.api.immediate()
                return work
            body = decode_body(body_of(row), depth) if body is None else body
            work.request = work.api.parse(body, self.config.handler.embed.max_inputs)
            work.token_ids = [self._token_ids(work.request, i) for i in range(len(work.request.inputs))]
        except ServingError as exc:
            work.error = exc
        except Exception as exc:
            logger.exception("preparing request %s failed", work.request_id)
            work.error = EngineError(f"preprocessing failed: {exc}")
        return work

    def _token_ids(self, request: EmbeddingRequest, i: int) -> list[int]:
        """Input i's token ids: a text tokenized (special tokens added), token ids used as sent; either
        within the model's maximum length (never truncated) and its vocabulary."""
        item, param, limit = request.inputs[i], request.input_param(i), self.encoder.max_length
        if isinstance(item, str):
            fewest = fewest_tokens(item, self._longest_token_chars)
            if fewest > limit:
                raise InvalidRequest(
                    f"'{param}' ({len(item)} characters, more than {fewest} tokens) is longer than this model's "
                    f"{limit} tokens; shorten it (this server does not truncate)",
                    param,
                )
            try:
                ids = self.encoder.tokenize(item)
            except (TypeError, ValueError, UnicodeError) as exc:
                raise InvalidRequest(f"'{param}' cannot be tokenized: {printable(str(exc))[:200]}", param) from None
        else:
            ids = list(item)
            vocab = self.encoder.vocab_size
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise InvalidRequest(
                    f"'{param}': token ids {bad[:5]} are outside the model's vocabulary (0..{vocab - 1})", param
                )
        if len(ids) > limit:
            raise InvalidRequest(
                f"'{param}' has {len(ids)} tokens; this model embeds at most {limit} tokens per input; shorten it "
                "(this server does not truncate)",
                param,
            )
        return ids

    # -- encode -------------------------------------------------------------------------

    def _encode(self, works: list[EmbeddingWork]) -> None:
        """Every input of `works` through the encoder, shortest first in groups (less padding);
        each request gets its rows back in its own order. A failed group fails only its requests."""
        started = time.perf_counter()
        rows = [(w, i, ids) for w in works for i, ids in enumerate(w.token_ids)]
        rows.sort(key=lambda row: len(row[2]))
        for work in works:
            work.vectors = np.zeros((len(work.token_ids), self.encoder.dimension), dtype=np.float32)
        size = self.config.handler.embed.encode_batch_size
        for start in range(0, len(rows), size):
            group = rows[start : start + size]
            try:
                vectors = self.encoder.encode([ids for _, _, ids in group]).numpy()
            except Exception as exc:
                logger.exception("encoding %d inputs failed", len(group))
                for work, _, _ in group:
                    work.error = work.error or EngineError(f"embedding failed: {exc}")
                continue
            for (work, i, _), vector in zip(group, vectors, strict=True):
                work.vectors[i] = vector
        if rows:
            logger.info(
                "embedding batch: %d request(s), %d input(s), %d tokens, encoded in %.1f ms",
                len(works),
                len(rows),
                sum(len(ids) for _, _, ids in rows),
                (time.perf_counter() - started) * 1000,
            )

    # -- finish -------------------------------------------------------------------------

    def _finish(self, work: EmbeddingWork, context: Any) -> str:
        if work.grpc:  # one reply, the last (handler/serving/grpc_jobs.py)
            end_grpc_reply(context, work.index)
        if work.error is not None:
            logger.info("request %s failed: %s %s", work.request_id, work.error.status, work.error.message)
            return error_reply(context, work.index, work.api, work.error)
        context.set_response_content_type(work.index, "application/json")
        if work.reply is not None:
            return work.reply
        assert work.request is not None and work.vectors is not None and isinstance(work.api, EmbeddingApi)
        tokens = sum(len(ids) for ids in work.token_ids)
        logger.info("request %s: inputs=%d prompt_tokens=%d", work.request_id, len(work.token_ids), tokens)
        return work.api.reply(work.request, work.vectors, tokens)

    def shutdown(self) -> None:
        self.drain.stop()
        self.encoder.close()
