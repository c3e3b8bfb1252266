"""The TorchServe side of the serving metrics (the catalogue and what each metric means:
handler/core/metrics.py): `TorchServeSink` writes them as TorchServe custom metrics through the
worker's `context.metrics`, and `arrival_time` reads a request's arrival from its headers."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ts.metrics.dimension import Dimension
from ts.metrics.metric_type_enum import MetricTypes

from handler.core.metrics import ServingMetrics
from handler.core.timing import REQUEST_START_HEADERS, RequestFigures, parse_request_start, request_figures
from handler.engine.sequence import Sequence

if TYPE_CHECKING:
    from handler.core.metrics import MetricSpec
    from handler.engine.step_engine import StepRecord
    from handler.replicas.replica_set import Health

logger = logging.getLogger(__name__)

__all__ = [
    "REQUEST_START_HEADERS",
    "RequestFigures",
    "TokenMetrics",
    "TorchServeSink",
    "arrival_time",
    "parse_request_start",
    "request_figures",
]


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


class TorchServeSink:
    """A `MetricSink` over TorchServe's `context.metrics`. TorchServe hands the worker the same
    context object for its whole life, so the sink holds it once bound."""

    def __init__(self, context: Any = None) -> None:
        self.context = context

    def bind(self, context: Any) -> None:
        self.context = context

    def observe(self, spec: MetricSpec, value: float, labels: dict[str, str] | None = None) -> None:
        if self.context is None:
            raise RuntimeError("no TorchServe context bound to the metrics yet")
        self.context.metrics.add_metric(
            spec.name,
            round(value, 6),
            spec.unit,
            idx=None,
            dimensions=[Dimension(label, text) for label, text in (labels or {}).items()],
            metric_type=MetricTypes(spec.kind.value),
        )


class TokenMetrics:
    """The context-taking calls of the TorchServe modes: each binds the context and records through
    `serving` (the frontend-neutral `ServingMetrics`); `bind(context)` returns it for direct use."""

    def __init__(self, compiled_batch_size: int) -> None:
        self.sink = TorchServeSink()
        self.serving = ServingMetrics(self.sink, compiled_batch_size)

    def bind(self, context: Any) -> ServingMetrics:
        self.sink.bind(context)
        return self.serving

    def micro_batch_started(self, context: Any, arrivals: list[float]) -> None:
        """Call as a micro-batch starts generating, with its requests' arrival times."""
        self.bind(context).micro_batch_started(arrivals)

    def request_finished(self, context: Any, sequence: Sequence) -> None:
        self.bind(context).request_finished(sequence)

    def engine_steps(self, context: Any, records: Iterable[StepRecord], occupied: int, waiting: int) -> None:
        self.bind(context).engine_steps(records, occupied, waiting)

    def replicas(self, context: Any, health: Health) -> None:
        self.bind(context).replicas(health)

    def round_trip(self, context: Any, seconds: float) -> None:
        self.bind(context).round_trip(seconds)

    def cancelled(self, context: Any) -> None:
        self.bind(context).cancelled()
