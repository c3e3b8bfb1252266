"""The three MicroBatching stages for one micro-batch, against a TorchServe context.

prepare:  body -> validated request -> prompt ids -> Sequence   (or a per-request error)
generate: run the micro-batch, send each request's text as it is decoded
finish:   the last NDJSON line, or the whole JSON body, and each request's status

Every stage answers each request on its own: one bad request gets its 4xx, its
batch-mates are served, and no exception escapes to kill a MicroBatching thread.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from ts.handler_utils.utils import send_intermediate_predict_response

from handler.api import Api, route_path, select_api
from handler.api.native import NativeApi
from handler.backends.base import Backend
from handler.backends.loader import load_backend
from handler.config import ServingConfig
from handler.engine import MicroBatchEngine
from handler.errors import EngineError, InvalidRequest, ServingError, to_http
from handler.metrics import TokenMetrics, arrival_time
from handler.protocol import GenerationRequest, Limits, decode_body
from handler.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass
class Work:
    """One request of the batch on its way through the stages."""

    index: int
    request_id: str
    api: Api
    sequence: Sequence | None = None
    error: ServingError | None = None
    chunks_sent: int = 0
    final_sent: bool = False  # a streamed request's closing chunk went out as soon as it finished
    arrived_at: float = 0.0  # perf_counter clock; see handler/metrics.py
    reply: str | None = None  # a route answered without generating (e.g. v1/models)


class GenerationService:
    def __init__(self, config: ServingConfig, backend: Backend) -> None:
        self.config = config
        self.backend = backend
        self.engine = MicroBatchEngine(backend, config.handler.generate_timeout_s)
        self.limits = Limits(config.handler.default_max_new_tokens, config.handler.max_new_tokens)
        self._tokenizer_lock = threading.Lock()  # HF fast tokenizers are not safe to share across threads
        self._socket_lock = threading.Lock()  # inference threads share the worker's one socket
        compiled = backend.static_batch_size or config.micro_batching.micro_batch_size
        self.token_metrics = TokenMetrics(compiled)

    @classmethod
    def from_context(cls, context: Any) -> GenerationService:
        config = ServingConfig.from_model_yaml(context.model_yaml_config)
        model_dir = context.system_properties.get("model_dir")
        started = time.perf_counter()
        backend = load_backend(config, model_dir, context)
        backend.warmup()
        logger.info(
            "backend %s ready in %.1f s (n_positions=%d, micro_batch_size=%d)",
            backend.name,
            time.perf_counter() - started,
            backend.n_positions,
            config.micro_batching.micro_batch_size,
        )
        return cls(config, backend)

    # -- stage 1 -----------------------------------------------------------------
    def prepare(self, indexed_rows: list[tuple[int, Any]], context: Any) -> list[Work]:
        return [self._prepare_one(index, row, context) for index, row in indexed_rows]

    def _prepare_one(self, index: int, row: Any, context: Any) -> Work:
        work = Work(index, context.get_request_id(index) or str(index), NativeApi())
        work.arrived_at = arrival_time(context, index)
        try:
            url_path = context.get_request_header(index, "url_path")
            body = None if route_path(url_path) else decode_body(_body_of(row))  # no route: the body picks it
            work.api = select_api(url_path, context.model_name, body)
            work.reply = work.api.immediate()
            if work.reply is not None:
                return work
            request = work.api.parse(_body_of(row) if body is None else body, self.limits, self.backend.tokenizer)
            with self._tokenizer_lock:  # a rendered chat template already holds its special tokens
                prompt_ids = self.backend.encode(request.prompt, add_special_tokens=request.add_special_tokens)
            self._check_length(request, len(prompt_ids))
            work.sequence = Sequence(
                request, prompt_ids, self.backend.tokenizer, self.backend.eos_token_ids, work.request_id
            )
        except ServingError as exc:
            work.error = exc
        except Exception as exc:
            logger.exception("preprocessing request %s failed", work.request_id)
            work.error = EngineError(f"preprocessing failed: {exc}")
        return work

    def _check_length(self, request: GenerationRequest, prompt_tokens: int) -> None:
        n_positions = self.backend.n_positions
        if prompt_tokens + request.max_new_tokens > n_positions:
            param = "prompt" if prompt_tokens >= n_positions else "max_new_tokens"
            raise InvalidRequest(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({request.max_new_tokens}) exceeds the model's "
                f"n_positions ({n_positions}); shorten the prompt or lower max_new_tokens",
                param,
            )

    # -- stage 2 -----------------------------------------------------------------
    def generate(self, work: list[Work], context: Any) -> list[Work]:
        runnable = [w for w in work if w.sequence is not None]
        by_sequence = {id(w.sequence): w for w in runnable}
        self.token_metrics.micro_batch_started(context, [w.arrived_at for w in runnable])
        for w in runnable:
            context.set_response_content_type(w.index, w.api.content_type(w.sequence.request))

        def on_text(sequence: Sequence, delta: str) -> None:
            if sequence.request.stream:
                w = by_sequence[id(sequence)]
                self._send_chunk(w, w.api.chunk(sequence, delta), context)

        def on_finished(sequence: Sequence) -> None:
            # Close the stream now (finish_reason, usage, [DONE]), not when the slowest row of
            # the micro-batch ends; the HTTP response itself ends with the batch.
            if sequence.request.stream:
                w = by_sequence[id(sequence)]
                self._send_chunk(w, w.api.final(sequence), context)
                w.final_sent = True

        try:
            self.engine.run([w.sequence for w in runnable], on_text, on_finished)
        except Exception as exc:
            logger.exception("micro-batch failed")
            for w in runnable:
                w.sequence.fail(EngineError(f"generation failed: {exc}"))
        return work

    def _send_chunk(self, work: Work, chunk: str, context: Any) -> None:
        with self._socket_lock:
            send_intermediate_predict_response(
                {work.index: chunk}, {work.index: work.request_id}, "Intermediate Prediction success", 200, context
            )
        work.chunks_sent += 1

    # -- stage 3 -----------------------------------------------------------------
    def finish(self, work: list[Work], context: Any) -> list[str]:
        return [self._finish_one(w, context) for w in work]

    def _finish_one(self, work: Work, context: Any) -> str:
        if work.reply is not None:
            context.set_response_content_type(work.index, "application/json")
            return work.reply
        sequence = work.sequence
        error = work.error or (sequence.error if sequence else None)
        if error is not None:
            logger.info("request %s failed: %s %s", work.request_id, error.status, error.message)
            if work.chunks_sent:  # status 200 is already on the wire: report in-band
                return work.api.error(error, midstream=True)
            http = to_http(error)
            context.set_response_status(http.status, http.phrase, work.index)
            context.set_response_content_type(work.index, "application/json")
            return work.api.error(error, midstream=False)
        self._log_request(work)
        self.token_metrics.request_finished(context, sequence)
        return "" if work.final_sent else work.api.final(sequence)

    def _log_request(self, work: Work) -> None:
        s = work.sequence
        ttft = (s.first_token_at - s.received_at) * 1000 if s.first_token_at else float("nan")
        total = ((s.last_token_at or s.received_at) - s.received_at) * 1000
        logger.info(
            "request %s: prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f total_ms=%.1f finish_reason=%s",
            work.request_id,
            len(s.prompt_ids),
            s.completion_tokens,
            ttft,
            total,
            s.finish_reason.value,
        )

    def close(self) -> None:
        self.backend.close()


def _body_of(row: Any) -> Any:
    """A TorchServe input row: {"body": ...} or {"data": ...} (plus e.g. model_name on /invocations)."""
    if isinstance(row, dict):
        for key in ("body", "data"):
            if row.get(key) is not None:
                return row[key]
        raise InvalidRequest("the request has no body", "body")
    return row
