"""What any frontend does with an embedding request (`handler.task: embed`), without its transport:

prepare:  body -> route (handler/api: OpenAI, feature extraction, model listing) -> validated
          request -> token ids per input, each checked against the vocabulary and the model's
          maximum length (or the error that request alone gets)
encode:   every good request's inputs together, sorted by length and run in groups of
          `handler.embed.encode_batch_size` (padded within a group), then handed back per request
finish:   each request's body in its route's format, or its error with the route's status

TorchServe's adapter (handler/serving/embedding.py) runs these on the batch its frontend hands over;
the ASGI frontend (handler/frontend/embedding.py) on the batch its own batcher gathers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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
from handler.core.request_checks import fewest_tokens, longest_token_chars
from handler.errors import EngineError, InvalidRequest, ServingError

logger = logging.getLogger(__name__)


@dataclass
class EmbeddingWork:
    """One request of a batch."""

    index: int
    request_id: str
    api: EmbeddingApi | ModelsApi = field(default_factory=FeatureExtractionApi)
    request: EmbeddingRequest | None = None
    token_ids: list[list[int]] = field(default_factory=list)
    vectors: np.ndarray | None = None
    error: ServingError | None = None
    reply: str | None = None  # answered without the model (the model listing)
    grpc: bool = False

    @property
    def encodes(self) -> bool:
        """Whether this request's inputs go through the encoder."""
        return self.error is None and self.reply is None


class EmbeddingCore:
    def __init__(self, config: ServingConfig, encoder: SentenceEncoder) -> None:
        self.config = config
        self.encoder = encoder
        self._longest_token_chars = longest_token_chars(encoder.tokenizer)

    # -- prepare ------------------------------------------------------------------------

    def prepare(
        self,
        work: EmbeddingWork,
        url_path: str | None,
        model_name: str,
        read_body: Callable[[], Any],
        refusal: Callable[[], ServingError | None] = lambda: None,
        intake: Callable[[], None] = lambda: None,
    ) -> EmbeddingWork:
        """`work` with its route, request and token ids, or its error. `read_body` gives the body as the
        transport has it (bytes, str or decoded JSON); `refusal` is the error every new request gets now
        (draining), raised once the route is known so that it is answered in the route's format;
        `intake` the transport's own checks (TorchServe's body form)."""
        try:
            intake()
            depth = self.config.handler.max_json_depth
            body = None if route_path(url_path) else decode_body(read_body(), depth)
            work.api = select_embedding_api(url_path, model_name, self.encoder.dimension, body)
            refused = refusal()
            if refused is not None:
                raise refused
            if isinstance(work.api, ModelsApi):
                work.reply = work.api.immediate()
                return work
            body = decode_body(read_body(), depth) if body is None else body
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

    def encode(self, works: list[EmbeddingWork]) -> None:
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

    def body(self, work: EmbeddingWork) -> str:
        """A request that succeeded: its JSON body in its route's format."""
        if work.reply is not None:
            return work.reply
        assert work.request is not None and work.vectors is not None and isinstance(work.api, EmbeddingApi)
        tokens = sum(len(ids) for ids in work.token_ids)
        logger.info("request %s: inputs=%d prompt_tokens=%d", work.request_id, len(work.token_ids), tokens)
        return work.api.reply(work.request, work.vectors, tokens)


def load_warm_encoder(
    config: ServingConfig, model_dir: str | Path | None, gpu_id: int | None = None, workers: int = 1
) -> SentenceEncoder:
    """The archive's encoder, loaded and warmed up (closed again if warm-up fails); `gpu_id` and
    `workers` place a Neuron encoder on its NeuronCore (TorchServe's worker; None and 1 elsewhere)."""
    started = time.perf_counter()
    encoder = load_encoder(config, model_dir, gpu_id, workers)
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
    return encoder


def error_answer(work: EmbeddingWork) -> tuple[int, str, str]:
    """A failed request: its status, reason phrase and JSON error body in its route's format."""
    assert work.error is not None
    logger.info("request %s failed: %s %s", work.request_id, work.error.status, work.error.message)
    status, phrase = work.api.http_status(work.error)
    return status, phrase, work.api.error(work.error, midstream=False)
