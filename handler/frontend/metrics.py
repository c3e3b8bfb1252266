"""Prometheus metrics of the ASGI frontend (`GET /metrics`, text format 0.0.4), written by hand:
the same names as the TorchServe adapter's custom metrics (handler/serving/metrics.py), as
counters, sums and counts (means: rate(sum) / rate(count)), plus the frontend's own requests."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable

from handler.core.timing import request_figures
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepRecord

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class FrontendMetrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._responses: Counter[tuple[str, int]] = Counter()  # (route, status)
        self._sums: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self._counters: Counter[str] = Counter()

    def response(self, route: str, status: int) -> None:
        with self._lock:
            self._responses[(route, status)] += 1

    def request_finished(self, sequence: Sequence) -> None:
        figures = request_figures(sequence)
        if figures is None:
            return
        with self._lock:
            self._observe("llm_time_to_first_token_seconds", figures.ttft_s)
            if figures.itl_s is not None:
                self._observe("llm_inter_token_latency_seconds", figures.itl_s)
            if sequence.admitted_at is not None:
                self._observe("llm_queue_wait_seconds", max(0.0, sequence.admitted_at - sequence.received_at))
            self._counters["llm_generated_tokens_total"] += figures.generated_tokens

    def engine_steps(self, records: Iterable[StepRecord]) -> None:
        with self._lock:
            for record in records:
                if record.prefill_s is not None:
                    self._observe("llm_prefill_step_seconds", record.prefill_s)
                if record.decode_s is not None:
                    self._observe("llm_decode_step_seconds", record.decode_s)

    def cancelled(self) -> None:
        with self._lock:
            self._counters["llm_cancelled_requests_total"] += 1

    def _observe(self, name: str, value: float) -> None:
        self._sums[name] += value
        self._counts[name] += 1

    def render(self, gauges: dict[str, float]) -> str:
        """The exposition text; `gauges` are read at scrape time (slots occupied, requests waiting...)."""
        lines: list[str] = []
        with self._lock:
            lines += ["# TYPE llm_http_responses_total counter"]
            for (route, status), n in sorted(self._responses.items()):
                lines.append(f'llm_http_responses_total{{route="{route}",status="{status}"}} {n}')
            for name in sorted(self._counters):
                lines += [f"# TYPE {name} counter", f"{name} {self._counters[name]}"]
            for name in sorted(self._sums):
                lines += [
                    f"# TYPE {name} summary",
                    f"{name}_sum {self._sums[name]:.6f}",
                    f"{name}_count {self._counts[name]}",
                ]
        for name, value in sorted(gauges.items()):
            kind = "counter" if name.endswith("_total") else "gauge"
            lines += [f"# TYPE {name} {kind}", f"{name} {value:g}"]
        return "\n".join(lines) + "\n"
