"""Statistics of one benchmark load, and the summary table.

A request's figures, all from the client's clock:
  TTFT     first text chunk - request sent
  ITL      (last text chunk - first text chunk) / (completion tokens - 1)   (guidellm's way)
  latency  end of the response - request sent
Per load: output tokens/s and requests/s over the load's duration (first request sent to
last response ended), counting successful requests only.

Also shared by the client (scripts/bench/client.py) and the discrete-event reference
(scripts/bench/des.py): the arrival times of an open load, and the sweep's points.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in 0..100); NaN when empty."""
    if not values:
        return math.nan
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def arrival_offsets(kind: str, rate: float, requests: int, seed: int) -> list[float]:
    """Send times (s from the load's start) of an open load: the first at 0, then gaps of
    1/rate (constant) or exponential with mean 1/rate (poisson) from Random(seed)."""
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(requests):
        out.append(t)
        t += rng.expovariate(rate) if kind == "poisson" else 1.0 / rate
    return out


@dataclass(frozen=True)
class Distribution:
    p50: float
    p90: float
    p99: float
    mean: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution:
        mean = sum(values) / len(values) if values else math.nan
        return cls(percentile(values, 50), percentile(values, 90), percentile(values, 99), mean)


@dataclass
class LoadSummary:
    name: str
    kind: str
    streams: int
    rate: float  # offered req/s for constant / poisson loads, else 0
    requests_ok: int
    requests_failed: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    mean_prompt_tokens: float
    mean_output_tokens: float
    ttft_ms: Distribution
    itl_ms: Distribution
    latency_s: Distribution
    errors: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)

    @property
    def offered_rate(self) -> float:
        """Offered load in req/s: the rate of an open load, the achieved rate of a closed one."""
        return self.rate or self.requests_per_s

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "offered_rate": self.offered_rate}


def summarize(name: str, kind: str, streams: int, rate: float, requests: list[dict[str, Any]]) -> LoadSummary:
    """`requests` are dicts with scheduled/started/first_token/last_token/ended (seconds),
    prompt_tokens, completion_tokens and error."""
    ok = [r for r in requests if r.get("error") is None]
    failed = [r for r in requests if r.get("error") is not None]
    start = min((r["started"] for r in requests), default=0.0)
    end = max((r["ended"] for r in requests), default=0.0)
    duration = max(end - start, 1e-9)
    ttft = [(r["first_token"] - r["started"]) * 1000 for r in ok if r.get("first_token") is not None]
    itl = [
        (r["last_token"] - r["first_token"]) * 1000 / (r["completion_tokens"] - 1)
        for r in ok
        if r.get("first_token") is not None and r["completion_tokens"] > 1
    ]
    latency = [r["ended"] - r["started"] for r in ok]
    tokens = sum(r["completion_tokens"] for r in ok)
    return LoadSummary(
        name=name,
        kind=kind,
        streams=streams,
        rate=rate,
        requests_ok=len(ok),
        requests_failed=len(failed),
        duration_s=duration,
        requests_per_s=len(ok) / duration,
        output_tokens_per_s=tokens / duration,
        mean_prompt_tokens=sum(r["prompt_tokens"] for r in ok) / len(ok) if ok else math.nan,
        mean_output_tokens=tokens / len(ok) if ok else math.nan,
        ttft_ms=Distribution.of(ttft),
        itl_ms=Distribution.of(itl),
        latency_s=Distribution.of(latency),
        errors=sorted({r["error"] for r in failed})[:5],
        requests=requests,
    )


def from_dict(data: dict[str, Any]) -> LoadSummary:
    fields = {k: v for k, v in data.items() if k != "offered_rate"}
    for key in ("ttft_ms", "itl_ms", "latency_s"):
        fields[key] = Distribution(**fields[key])
    return LoadSummary(**fields)


def format_table(summaries: Sequence[LoadSummary], limits: Sequence[LoadSummary | None] | None = None) -> str:
    """One line per load; with `limits` (the same loads simulated, one per summary or None),
    three more columns: the limit's TTFT p50, ITL p50 and output tok/s."""
    width = max([20, *(len(s.name) + 1 for s in summaries)])
    header = (
        f"{'load':<{width}} {'ok/fail':>9} {'req/s':>7} {'out tok/s':>9} "
        f"{'TTFT ms p50/p90/p99':>22} {'ITL ms p50/p90/p99':>20} {'latency s p50/p90/p99':>22}"
    )
    if limits is not None:
        header += f" | {'limit TTFT':>10} {'ITL':>6} {'tok/s':>7}"
    lines = [header, "-" * len(header)]
    for n, s in enumerate(summaries):
        t, i, e = s.ttft_ms, s.itl_ms, s.latency_s
        line = (
            f"{s.name:<{width}} {f'{s.requests_ok}/{s.requests_failed}':>9} {s.requests_per_s:>7.2f} "
            f"{s.output_tokens_per_s:>9.1f} {f'{t.p50:.1f}/{t.p90:.1f}/{t.p99:.1f}':>22} "
            f"{f'{i.p50:.2f}/{i.p90:.2f}/{i.p99:.2f}':>20} {f'{e.p50:.2f}/{e.p90:.2f}/{e.p99:.2f}':>22}"
        )
        limit = limits[n] if limits is not None and n < len(limits) else None
        if limit is not None:
            line += f" | {limit.ttft_ms.p50:>10.1f} {limit.itl_ms.p50:>6.2f} {limit.output_tokens_per_s:>7.1f}"
        lines.append(line)
    return "\n".join(lines)


# -- the sweep -----------------------------------------------------------------------------
@dataclass(frozen=True)
class SweepPoint:
    """One open load of a sweep: offered load as a fraction of capacity, and what it gave."""

    fraction: float
    rate: float
    ttft_p50_ms: float
    ttft_p90_ms: float
    itl_p50_ms: float
    output_tokens_per_s: float

    @classmethod
    def of(cls, summary: LoadSummary, capacity: float) -> SweepPoint:
        return cls(
            summary.offered_rate / capacity,
            summary.offered_rate,
            summary.ttft_ms.p50,
            summary.ttft_ms.p90,
            summary.itl_ms.p50,
            summary.output_tokens_per_s,
        )


def sweep_points(summaries: Sequence[LoadSummary], capacity: float) -> list[SweepPoint]:
    """The open (poisson / constant) loads, by offered load."""
    open_loads = [s for s in summaries if s.kind in ("poisson", "constant")]
    return sorted((SweepPoint.of(s, capacity) for s in open_loads), key=lambda p: p.fraction)


def knee(points: Sequence[SweepPoint], idle_ttft_ms: float, factor: float = 2.0, tail: bool = False) -> float | None:
    """The lowest offered load (fraction of capacity) whose TTFT p50 (p90 with `tail`)
    exceeds `factor` x the idle TTFT p50, or None when no point does: where waiting for a
    slot or a batch starts to dominate the first token."""
    for p in sorted(points, key=lambda p: p.fraction):
        if (p.ttft_p90_ms if tail else p.ttft_p50_ms) > factor * idle_ttft_ms:
            return p.fraction
    return None
