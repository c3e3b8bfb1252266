"""The one catalogue of the serving metrics, and `ServingMetrics`, which records them for either
frontend through a `MetricSink`: TorchServe's custom metrics (handler/serving/metrics.py) or the
ASGI frontend's Prometheus registry (handler/frontend/metrics.py). Transport-free: this module
ships in the TorchServe archive, which has neither TorchServe's types here nor prometheus_client.

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
  llm_decode_tokens_per_row        with speculation: a decode step's tokens per row (1 to k + 1)
  llm_spec_proposed_tokens         speculation: tokens proposed for verification (counter)
  llm_spec_accepted_tokens         speculation: proposed tokens accepted (counter; accepted /
                                   proposed is the acceptance rate)
  llm_frontend_round_trip_seconds  from one handler reply to the frontend's next call
                                   (TorchServe only: the ASGI frontend has no such gap)
  llm_cancelled_requests           requests whose client went away before the end (counter)
  llm_rejected_requests            requests answered a fast 503 with Retry-After (counter, label
                                   `reason`: queue_wait, in_flight)
With scheduler.replicas > 1, per handler call (the ASGI frontend: per scrape):
  llm_replicas_ready               replicas serving (gauge; below scheduler.replicas while one
                                   restarts)
  llm_replica_slots_occupied       slots holding a sequence, per replica (gauge, label
                                   `Replica`; not reported for a replica that is not serving)
The ASGI frontend's own (TorchServe has its own request metrics):
  llm_http_responses               responses by route and status (counter; `_total` in Prometheus)
  llm_model_ready                  1 once the model serves, else 0 (gauge)
  llm_requests_in_flight           requests the frontend holds, generating or waiting (gauge)
  llm_engine_steps                 engine steps since the start (counter; `_total` in Prometheus)

"Arrival" (both modes) is the `X-Request-Start` request header when a client or proxy sets it
(`t=<unix seconds>` or plain unix seconds; milliseconds and microseconds are recognised
by size, as nginx and Heroku write them), which then also counts the time the request
waited in TorchServe's frontend queue and batch delay. TorchServe itself does not tell
the handler when a request reached the frontend, so without the header arrival is when
the handler received it, and queue wait is only the wait inside the worker (for earlier
micro-batches of the same frontend batch). TorchServe's own `QueueTime` metric covers
the frontend queue per batch.

In TorchServe's `metrics_mode=prometheus`, histograms export `_sum` and `_count` (means:
rate(sum) / rate(count)) and the frontend's default buckets; values are in seconds for that
reason. TorchServe prefixes nothing; it adds the ModelName, Level and Hostname labels.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Concatenate, ParamSpec, Protocol

from handler.core.timing import request_figures
from handler.engine.sequence import Sequence

if TYPE_CHECKING:
    from handler.engine.step_engine import StepRecord
    from handler.replicas.replica_set import Health

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")


class MetricKind(str, Enum):
    """How a sink takes a value: a counter adds it, a gauge is set to it, a histogram observes it."""

    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True)
class MetricSpec:
    name: str  # a counter's base name: Prometheus exporters add `_total`
    kind: MetricKind
    unit: str  # TorchServe's unit argument
    help: str
    labels: tuple[str, ...] = ()


COUNTER, GAUGE, HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM
TTFT = MetricSpec("llm_time_to_first_token_seconds", HISTOGRAM, "s", "From the request's arrival to its first token.")
ITL = MetricSpec(
    "llm_inter_token_latency_seconds", HISTOGRAM, "s", "Mean gap between a request's tokens (guidellm's ITL)."
)
GENERATED_TOKENS = MetricSpec("llm_generated_tokens", COUNTER, "count", "Completion tokens of finished requests.")
QUEUE_WAIT = MetricSpec(
    "llm_queue_wait_seconds", HISTOGRAM, "s", "From a request's arrival to its slot or micro-batch."
)
FILL = MetricSpec("llm_micro_batch_fill_ratio", HISTOGRAM, "ratio", "Real rows / compiled batch size (static mode).")
OCCUPIED = MetricSpec("llm_slots_occupied", GAUGE, "count", "Slots holding a sequence.")
WAITING = MetricSpec("llm_requests_waiting", GAUGE, "count", "Requests waiting for a slot.")
PREFILL_STEP = MetricSpec("llm_prefill_step_seconds", HISTOGRAM, "s", "One engine step's prefills.")
DECODE_STEP = MetricSpec("llm_decode_step_seconds", HISTOGRAM, "s", "One decode step over the live slots.")
STEP_SAMPLING = MetricSpec(
    "llm_step_sampling_seconds", HISTOGRAM, "s", "A step's host time choosing tokens from logits."
)
STEP_DETOKENIZE = MetricSpec(
    "llm_step_detokenize_seconds", HISTOGRAM, "s", "A step's host time detokenizing and checking stops and ends."
)
ROUND_TRIP = MetricSpec(
    "llm_frontend_round_trip_seconds", HISTOGRAM, "s", "From one handler reply to TorchServe's next call."
)
CANCELLED = MetricSpec("llm_cancelled_requests", COUNTER, "count", "Requests whose client went away before the end.")
REJECTED = MetricSpec(
    "llm_rejected_requests",
    COUNTER,
    "count",
    "Requests answered a fast 503 with Retry-After, by reason (queue_wait: no slot within handler.max_queue_wait_s; "
    "in_flight: the ASGI frontend's in-flight bound).",
    ("reason",),
)
REPLICAS_READY = MetricSpec("llm_replicas_ready", GAUGE, "count", "Replicas serving (scheduler.replicas > 1).")
REPLICA_OCCUPIED = MetricSpec(
    "llm_replica_slots_occupied", GAUGE, "count", "Slots holding a sequence, per serving replica.", ("Replica",)
)
HTTP_RESPONSES = MetricSpec(
    "llm_http_responses", COUNTER, "count", "Responses of the ASGI frontend by route and status.", ("route", "status")
)
MODEL_READY = MetricSpec("llm_model_ready", GAUGE, "count", "1 once the model serves, else 0.")
IN_FLIGHT = MetricSpec("llm_requests_in_flight", GAUGE, "count", "Requests the ASGI frontend holds.")
ENGINE_STEPS = MetricSpec("llm_engine_steps", COUNTER, "count", "Engine steps since the start.")
SPEC_PROPOSED = MetricSpec(
    "llm_spec_proposed_tokens",
    COUNTER,
    "count",
    "Speculative decoding: tokens proposed for verification (prompt lookup's, or a draft model's).",
)
SPEC_ACCEPTED = MetricSpec(
    "llm_spec_accepted_tokens", COUNTER, "count", "Speculative decoding: proposed tokens the model accepted."
)
TOKENS_PER_ROW = MetricSpec(
    "llm_decode_tokens_per_row",
    HISTOGRAM,
    "tokens",
    "A decode step's tokens per row: 1 without speculation, up to k + 1 with it.",
)

# What the handler reports through TorchServe (both frontends report them), in this order.
SERVING_METRICS = (
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
    TOKENS_PER_ROW,
    SPEC_PROPOSED,
    SPEC_ACCEPTED,
    ROUND_TRIP,
    CANCELLED,
    REJECTED,
    REPLICAS_READY,
    REPLICA_OCCUPIED,
)
ASGI_METRICS = (HTTP_RESPONSES, MODEL_READY, IN_FLIGHT, ENGINE_STEPS)  # the ASGI frontend's own
ALL_METRICS = SERVING_METRICS + ASGI_METRICS
BY_NAME = {spec.name: spec for spec in ALL_METRICS}


class MetricSink(Protocol):
    def observe(self, spec: MetricSpec, value: float, labels: dict[str, str] | None = None) -> None:
        """Record `value` as `spec.kind` says: add it (counter), set it (gauge) or observe it (histogram)."""
        ...


def _never_raises(
    method: Callable[Concatenate[ServingMetrics, _P], None],
) -> Callable[Concatenate[ServingMetrics, _P], None]:
    @functools.wraps(method)
    def guarded(self: ServingMetrics, *args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            method(self, *args, **kwargs)
        except Exception:
            self._failed(method.__name__)

    return guarded


class ServingMetrics:
    """Records the catalogue's metrics into `sink`. Never raises: metrics must not fail a request,
    so a failure is logged (once) and the value dropped."""

    def __init__(self, sink: MetricSink, compiled_batch_size: int) -> None:
        self.sink = sink
        self.compiled_batch_size = max(1, compiled_batch_size)
        self.warned = False  # a recording failed (and was logged)

    @_never_raises
    def micro_batch_started(self, arrivals: list[float]) -> None:
        """As a static micro-batch starts generating, with its requests' arrival times (perf_counter clock)."""
        if not arrivals:
            return
        now = time.perf_counter()
        self.record(FILL, len(arrivals) / self.compiled_batch_size)
        for arrived in arrivals:
            self.record(QUEUE_WAIT, max(0.0, now - arrived))

    @_never_raises
    def request_finished(self, sequence: Sequence) -> None:
        figures = request_figures(sequence)
        if figures is None:
            return
        self.record(TTFT, figures.ttft_s)
        if figures.itl_s is not None:
            self.record(ITL, figures.itl_s)
        self.record(GENERATED_TOKENS, figures.generated_tokens)
        if sequence.admitted_at is not None:
            self.record(QUEUE_WAIT, max(0.0, sequence.admitted_at - sequence.received_at))

    @_never_raises
    def engine_steps(self, records: Iterable[StepRecord], occupied: int | None, waiting: int | None) -> None:
        """The steps' timings, then the slot gauges (left as they are when None)."""
        for step in records:
            if step.prefill_s is not None:
                self.record(PREFILL_STEP, step.prefill_s)
            if step.decode_s is not None:
                self.record(DECODE_STEP, step.decode_s)
            self.record(STEP_SAMPLING, step.sampling_s)
            self.record(STEP_DETOKENIZE, step.detokenize_s)
            if step.speculating and step.decoded:  # always 1 otherwise: not worth a value per step
                self.record(TOKENS_PER_ROW, step.decoded_tokens / step.decoded)
            if step.proposed_tokens:
                self.record(SPEC_PROPOSED, step.proposed_tokens)
                self.record(SPEC_ACCEPTED, step.accepted_tokens)
        if occupied is not None:
            self.record(OCCUPIED, occupied)
        if waiting is not None:
            self.record(WAITING, waiting)

    @_never_raises
    def replicas(self, health: Health) -> None:
        self.record(REPLICAS_READY, health.ready)
        for index, occupied in enumerate(health.occupancy):
            if occupied is not None:
                self.record(REPLICA_OCCUPIED, occupied, {"Replica": str(index)})

    def round_trip(self, seconds: float) -> None:
        self.record(ROUND_TRIP, seconds)

    def cancelled(self) -> None:
        self.record(CANCELLED, 1)

    def rejected(self, reason: str) -> None:
        self.record(REJECTED, 1, {"reason": reason})

    def response(self, route: str, status: int) -> None:
        self.record(HTTP_RESPONSES, 1, {"route": route, "status": str(status)})

    def record(self, spec: MetricSpec, value: float, labels: dict[str, str] | None = None) -> None:
        """One value of any catalogue metric (a gauge read at scrape time, say), never raising."""
        try:
            self.sink.observe(spec, value, labels)
        except Exception:
            self._failed(spec.name)

    def _failed(self, what: str) -> None:
        if not self.warned:
            self.warned = True
            logger.warning("could not record metric %s (further failures are not logged)", what, exc_info=True)
