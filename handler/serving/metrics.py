"""Token-level serving metrics, reported as TorchServe custom metrics.

Per request (when it finishes successfully):
  llm_time_to_first_token_seconds  from the request's arrival (below) to its first token
  llm_inter_token_latency_seconds  (last token - first token) / (tokens - 1), as guidellm
                                   computes ITL; not reported for one-token requests
  llm_generated_tokens             completion tokens (a counter: rate() is output tok/s)
  llm_queue_wait_seconds           static: from arrival to the start of its micro-batch;
                                   continuous: from arrival to getting a slot
Per micro-batch (static mode):
  llm_micro_batch_fill_ratio       real rows / compiled batch size
Continuous mode, per handler call / engine step:
  llm_slots_occupied               slots holding a sequence (gauge, after the call)
  llm_requests_waiting             requests waiting for a slot (gauge)
  llm_prefill_step_seconds         one step's prefills (all rows admitted in that step)
  llm_decode_step_seconds          one decode step over the live slots
  llm_step_sampling_seconds        the host's share of a step spent choosing tokens from the
                                   logits (inside the prefill and decode times above)
  llm_step_detokenize_seconds      the host's share spent after them: detokenizing, stop
                                   strings and end checks of every row
  llm_frontend_round_trip_seconds  from one handler reply to the frontend's next call
  llm_cancelled_requests           requests whose client went away before the end (counter)
With scheduler.replicas > 1, per handler call:
  llm_replicas_ready               replicas serving (gauge; below scheduler.replicas while one
                                   restarts)
  llm_replica_slots_occupied       slots holding a sequence, per replica (gauge, dimension
                                   `Replica`; not reported for a replica that is not serving)

"Arrival" (both modes) is the `X-Request-Start` request header when a client or proxy sets it
(`t=<unix seconds>` or plain unix seconds; milliseconds and microseconds are recognised
by size, as nginx and Heroku write them), which then also counts the time the request
waited in TorchServe's frontend queue and batch delay. TorchServe itself does not tell
the handler when a request reached the frontend, so without the header arrival is when
the handler received it, and queue wait is only the wait inside the worker (for earlier
micro-batches of the same frontend batch). TorchServe's own `QueueTime` metric covers
the frontend queue per batch.

In `metrics_mode=prometheus`, histograms export `_sum` and `_count` (means: rate(sum) /
rate(count)) and the frontend's default buckets; values are in seconds for that reason.
TorchServe prefixes nothing; it adds the ModelName, Level and Hostname labels.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes

from handler.core.timing import REQUEST_START_HEADERS, RequestFigures, parse_request_start, request_figures
from handler.engine.sequence import Sequence

if TYPE_CHECKING:
    from handler.engine.step_engine import StepRecord
    from handler.replicas.replica_set import Health

logger = logging.getLogger(__name__)

__all__ = [
    "REQUEST_START_HEADERS",
    "RequestFigures",
    "TokenMetrics",
    "arrival_time",
    "parse_request_start",
    "request_figures",
]


@dataclass(frozen=True)
class MetricSpec:
    name: str
    unit: str
    metric_type: MetricTypes


TTFT = MetricSpec("llm_time_to_first_token_seconds", "s", MetricTypes.HISTOGRAM)
ITL = MetricSpec("llm_inter_token_latency_seconds", "s", MetricTypes.HISTOGRAM)
GENERATED_TOKENS = MetricSpec("llm_generated_tokens", "count", MetricTypes.COUNTER)
QUEUE_WAIT = MetricSpec("llm_queue_wait_seconds", "s", MetricTypes.HISTOGRAM)
FILL = MetricSpec("llm_micro_batch_fill_ratio", "ratio", MetricTypes.HISTOGRAM)
OCCUPIED = MetricSpec("llm_slots_occupied", "count", MetricTypes.GAUGE)
WAITING = MetricSpec("llm_requests_waiting", "count", MetricTypes.GAUGE)
PREFILL_STEP = MetricSpec("llm_prefill_step_seconds", "s", MetricTypes.HISTOGRAM)
DECODE_STEP = MetricSpec("llm_decode_step_seconds", "s", MetricTypes.HISTOGRAM)
STEP_SAMPLING = MetricSpec("llm_step_sampling_seconds", "s", MetricTypes.HISTOGRAM)
STEP_DETOKENIZE = MetricSpec("llm_step_detokenize_seconds", "s", MetricTypes.HISTOGRAM)
ROUND_TRIP = MetricSpec("llm_frontend_round_trip_seconds", "s", MetricTypes.HISTOGRAM)
CANCELLED = MetricSpec("llm_cancelled_requests", "count", MetricTypes.COUNTER)
REPLICAS_READY = MetricSpec("llm_replicas_ready", "count", MetricTypes.GAUGE)
REPLICA_OCCUPIED = MetricSpec("llm_replica_slots_occupied", "count", MetricTypes.GAUGE)
ALL_METRICS = (
    TTFT,
    ITL,
    GENERATED_TOKENS,
    QUEUE_WAIT,
    FILL,
    OCCUPIED,
    WAITING,
    PREFILL_STEP,
    DECODE_STEP,
    STEP_SAMPLING,
    STEP_DETOKENIZE,
    ROUND_TRIP,
    CANCELLED,
    REPLICAS_READY,
    REPLICA_OCCUPIED,
)


def arrival_time(context: Any, index: int) -> float:
    """When request `index` arrived, on the `time.perf_counter()` clock."""
    now = time.perf_counter()
    try:
        for header in REQUEST_START_HEADERS:
            wall = parse_request_start(context.get_request_header(index, header), time.time())
            if wall is not None:
                return now - max(0.0, time.time() - wall)
    except Exception:  # metrics must never fail a request
        logger.debug("could not read X-Request-Start", exc_info=True)
    return now


class TokenMetrics:
    """Emits the metrics above through `context.metrics`; never raises."""

    def __init__(self, compiled_batch_size: int) -> None:
        self.compiled_batch_size = max(1, compiled_batch_size)
        self._warned = False

    def micro_batch_started(self, context: Any, arrivals: list[float]) -> None:
        """Call as a micro-batch starts generating, with its requests' arrival times."""
        if not arrivals:
            return
        now = time.perf_counter()
        self._emit(context, FILL, len(arrivals) / self.compiled_batch_size)
        for arrived in arrivals:
            self._emit(context, QUEUE_WAIT, max(0.0, now - arrived))

    def request_finished(self, context: Any, sequence: Sequence) -> None:
        figures = request_figures(sequence)
        if figures is None:
            return
        self._emit(context, TTFT, figures.ttft_s)
        if figures.itl_s is not None:
            self._emit(context, ITL, figures.itl_s)
        self._emit(context, GENERATED_TOKENS, figures.generated_tokens)
        if sequence.admitted_at is not None:
            self._emit(context, QUEUE_WAIT, max(0.0, sequence.admitted_at - sequence.received_at))

    def engine_steps(self, context: Any, records: Iterable[StepRecord], occupied: int, waiting: int) -> None:
        for record in records:
            if record.prefill_s is not None:
                self._emit(context, PREFILL_STEP, record.prefill_s)
            if record.decode_s is not None:
                self._emit(context, DECODE_STEP, record.decode_s)
            self._emit(context, STEP_SAMPLING, record.sampling_s)
            self._emit(context, STEP_DETOKENIZE, record.detokenize_s)
        self._emit(context, OCCUPIED, occupied)
        self._emit(context, WAITING, waiting)

    def replicas(self, context: Any, health: Health) -> None:
        self._emit(context, REPLICAS_READY, health.ready)
        for index, occupied in enumerate(health.occupancy):
            if occupied is not None:
                self._emit(context, REPLICA_OCCUPIED, occupied, [Dimension("Replica", str(index))])

    def round_trip(self, context: Any, seconds: float) -> None:
        self._emit(context, ROUND_TRIP, seconds)

    def cancelled(self, context: Any) -> None:
        self._emit(context, CANCELLED, 1)

    def _emit(self, context: Any, spec: MetricSpec, value: float, dimensions: list[Dimension] | None = None) -> None:
        try:
            context.metrics.add_metric(
                spec.name,
                round(value, 6),
                spec.unit,
                idx=None,
                dimensions=dimensions or [],
                metric_type=spec.metric_type,
            )
        except Exception:
            if not self._warned:
                self._warned = True
                logger.warning("could not record metric %s", spec.name, exc_info=True)
