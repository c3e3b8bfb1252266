"""`scheduler.mode: static`: TorchServe batching + MicroBatching, the seed's design.

TorchServe hands over a batch; `MicroBatching` splits it into micro-batches and runs the
three stages below on its threads; each micro-batch runs to its end (`MicroBatchEngine`):
prepare:  body -> validated request -> prompt ids -> Sequence   (or a per-request error)
generate: run the micro-batch, send each request's text as it is decoded
finish:   the last NDJSON line, or the whole JSON body, and each request's status

Draining (handler/serving/drain.py): prepare answers new requests 503; at the deadline the
running micro-batches stop and their requests end with an error (a last error line
where the stream is open). TorchServe hands a worker one batch at a time, so a request
that arrives while a batch runs gets its 503 when that batch ends.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ts.handler_utils.micro_batching import MicroBatching
from ts.handler_utils.utils import send_intermediate_predict_response

from handler.core.response import log_request
from handler.engine.micro_batch import MicroBatchEngine
from handler.engine.sequence import Sequence
from handler.errors import EngineError, ServingError
from handler.serving import drain
from handler.serving.grpc_jobs import end_grpc_reply
from handler.serving.replies import encodable, error_reply, set_content_type, wire_error
from handler.serving.service import CallWork, GenerationService

logger = logging.getLogger(__name__)


class StaticServing:
    def __init__(self, service: GenerationService, context: Any) -> None:
        self.service = service
        self.context = context
        self.engine = MicroBatchEngine(service.backend, interrupt=self._drain_deadline)
        self._socket_lock = threading.Lock()  # inference threads share the worker's one socket
        micro = service.config.micro_batching
        self.micro_batching = _IndexedMicroBatching(self, micro.micro_batch_size)
        self.micro_batching.parallelism = micro.parallelism.model_dump()
        self._calls = 0  # handle() calls running: the frontend sends one batch at a time
        # After a batch the frontend may take up to maxBatchDelay to send the next one (requests
        # that queued meanwhile): idle that long before counting as drained, so they get their 503.
        self.drain = drain.DrainWatcher.from_env(lambda: self._calls > 0, settle_s=batch_delay_s(context) + 0.2)
        self.drain.start()

    def handle(self, data: list[Any], context: Any) -> list[str]:
        self.context = context
        self._calls += 1
        try:
            return self.micro_batching.handle(data)
        finally:
            self._calls -= 1

    def _drain_deadline(self) -> ServingError | None:
        return drain.cut() if self.drain.expired else None

    # MicroBatching calls these three on its threads.
    def preprocess(self, indexed_rows: list[tuple[int, Any]]) -> list[CallWork]:
        return [self._prepare(index, row) for index, row in indexed_rows]

    def _prepare(self, index: int, row: Any) -> CallWork:
        refusal = drain.refused() if self.drain.draining else None
        return self.service.prepare(index, row, self.context, refusal, compiled=True)

    def inference(self, work: list[CallWork], *args: Any, **kwargs: Any) -> list[CallWork]:
        context = self.context
        runnable = [w for w in work if w.sequence is not None]
        by_sequence = {id(w.sequence): w for w in runnable}
        self.service.token_metrics.micro_batch_started(context, [w.arrived_at for w in runnable])
        for w in runnable:
            set_content_type(context, w.index, w.api.content_type(w.sequence.request))

        def on_text(sequence: Sequence, delta: str) -> None:
            if sequence.request.stream:
                w = by_sequence[id(sequence)]
                self._send_chunk(w, w.api.chunk(sequence, delta), context)

        def on_finished(sequence: Sequence) -> None:
            # Close the stream now (finish_reason, usage, [DONE]), not when the slowest row of
            # the micro-batch ends; the HTTP response itself ends with the batch.
            if sequence.request.stream and sequence.error is None:
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

    def _send_chunk(self, work: CallWork, chunk: str, context: Any) -> None:
        if not chunk:  # a route holding text back (a possible tool call) has nothing to send yet
            return
        with self._socket_lock:
            send_intermediate_predict_response(
                {work.index: encodable([chunk])[0]},
                {work.index: work.request_id},
                "Intermediate Prediction success",
                200,
                context,
            )
        work.chunks_sent += 1

    def postprocess(self, work: list[CallWork]) -> list[str]:
        return [self._finish_one(w, self.context) for w in work]

    def _finish_one(self, work: CallWork, context: Any) -> str:
        if work.grpc:  # one reply, the last (handler/serving/grpc_jobs.py)
            end_grpc_reply(context, work.index)
        if work.reply is not None:
            context.set_response_content_type(work.index, "application/json")
            return work.reply
        sequence = work.sequence
        error = work.error or (wire_error(work.api, sequence.error) if sequence and sequence.error else None)
        if error is not None:
            logger.info("request %s failed: %s %s", work.request_id, error.status, error.message)
            if work.chunks_sent:  # status 200 is already on the wire: report in-band
                return work.api.error(error, midstream=True)
            return error_reply(context, work.index, work.api, error)
        log_request(sequence)
        self.service.token_metrics.request_finished(context, sequence)
        return "" if work.final_sent else work.api.final(sequence)

    def shutdown(self) -> None:
        """MicroBatching's threads are not daemons: stop them."""
        self.drain.stop()
        self.micro_batching.shutdown()


def batch_delay_s(context: Any) -> float:
    """The model's maxBatchDelay (TorchServe's default: 100 ms)."""
    try:
        return float((getattr(context, "model_yaml_config", None) or {}).get("maxBatchDelay", 100)) / 1000
    except (TypeError, ValueError):
        return 0.1


class _IndexedMicroBatching(MicroBatching):
    """MicroBatching, told the batch-wide index of every request: streaming replies and
    per-request statuses are addressed by the index in the frontend batch, but
    MicroBatching hands each stage only its slice of the batch."""

    def handle(self, data: list[Any]) -> list[Any]:
        request_ids = getattr(self.handler.context, "request_ids", None) or {}
        logger.info(
            "frontend batch of %d request(s): %s",
            len(data),
            ",".join(request_ids.get(i, "?") for i in range(len(data))),
        )
        return super().handle(list(enumerate(data)))
