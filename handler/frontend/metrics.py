"""Prometheus metrics of the ASGI frontend (`GET /metrics`), kept by prometheus_client: the catalogue
of handler/core/metrics.py (the names TorchServe's custom metrics have), recorded through the same
`ServingMetrics` as the TorchServe adapter, plus the frontend's own requests."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from handler.core.metrics import (
    ALL_METRICS,
    BY_NAME,
    ENGINE_STEPS,
    REPLICA_OCCUPIED,
    MetricKind,
    MetricSpec,
    ServingMetrics,
)
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepRecord

if TYPE_CHECKING:
    from handler.replicas.replica_set import Health

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_LATEST
INF = float("inf")
# Step times run from a millisecond (sim, small models) to seconds (long prefills); TTFT and
# queue waits up to a minute under load.
SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, INF)
RATIO_BUCKETS = (0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1.0, INF)
TOKEN_BUCKETS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 9.0, INF)  # tokens per row per step (k <= 8)
# Totals their owner keeps (the engine counts its steps), read at scrape time rather than added to.
SCRAPED_TOTALS = (ENGINE_STEPS,)


def _metric(spec: MetricSpec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.kind is MetricKind.COUNTER:
        return Counter(spec.name, spec.help, spec.labels, registry=registry)
    if spec.kind is MetricKind.GAUGE:
        return Gauge(spec.name, spec.help, spec.labels, registry=registry)
    buckets = {"ratio": RATIO_BUCKETS, "tokens": TOKEN_BUCKETS}.get(spec.unit, SECONDS_BUCKETS)
    return Histogram(spec.name, spec.help, spec.labels, registry=registry, buckets=buckets)


class _ScrapedTotals(Collector):
    def __init__(self, totals: dict[str, float]) -> None:
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        for spec in SCRAPED_TOTALS:
            yield CounterMetricFamily(spec.name, spec.help, value=self.totals.get(spec.name, 0.0))


class FrontendMetrics:
    """A `MetricSink` over a registry of its own (several apps may live in one process, as in the
    tests); `serving` records into it as the TorchServe adapter records into TorchServe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._metrics = {spec.name: _metric(spec, self.registry) for spec in ALL_METRICS if spec not in SCRAPED_TOTALS}
        self._totals: dict[str, float] = {}
        self._refused: set[str] = set()  # names render() was given that it cannot set (warned once)
        self.registry.register(_ScrapedTotals(self._totals))
        self.serving = ServingMetrics(self, compiled_batch_size=1)  # no micro-batches here

    def observe(self, spec: MetricSpec, value: float, labels: dict[str, str] | None = None) -> None:
        if spec in SCRAPED_TOTALS:
            self._totals[spec.name] = value
            return
        metric = self._metrics[spec.name]
        child = metric.labels(**labels) if labels else metric
        if spec.kind is MetricKind.HISTOGRAM:
            child.observe(value)
        elif spec.kind is MetricKind.COUNTER:
            child.inc(value)
        else:
            child.set(value)

    def response(self, route: str, status: int) -> None:
        self.serving.response(route, status)

    def request_finished(self, sequence: Sequence) -> None:
        self.serving.request_finished(sequence)

    def engine_steps(
        self, records: Iterable[StepRecord], occupied: int | None = None, waiting: int | None = None
    ) -> None:
        self.serving.engine_steps(records, occupied, waiting)

    def replicas(self, health: Health) -> None:
        """The replica gauges; a replica that is not serving drops out of the per-replica one."""
        self._metrics[REPLICA_OCCUPIED.name].clear()
        self.serving.replicas(health)

    def cancelled(self) -> None:
        self.serving.cancelled()

    def render(self, gauges: dict[str, float]) -> str:
        """The exposition text. `gauges` are values read at scrape time: catalogue gauges (llm_model_ready...)
        and the totals of SCRAPED_TOTALS (with or without `_total`)."""
        for name, value in gauges.items():
            spec = BY_NAME.get(name.removesuffix("_total"))
            if spec is not None and (spec.kind is MetricKind.GAUGE or spec in SCRAPED_TOTALS):
                self.serving.record(spec, value)
            elif name not in self._refused:
                self._refused.add(name)
                logger.warning("%s is neither a gauge nor a scraped total of the metric catalogue", name)
        return generate_latest(self.registry).decode()
