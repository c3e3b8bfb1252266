"""Discrete-event reference: what a scheduling policy alone gives, with the profile's step
times and no serving overhead at all (requests reach the engine the instant they are sent,
tokens reach the client the instant a step ends).

Policies (`--policy`, all by default):
- `continuous`: the engine as built (model-config `scheduler.mode: continuous`), its
  admission done by the engine's own `SlotScheduler` (handler/engine/scheduler.py) under a
  virtual clock, not by a copy of it. Each engine step (1) admits waiting requests into free
  slots in FIFO order while the sum of their prompt tokens stays within
  `prefill_token_budget` (at least one when a slot is free) and prefills them one row at a time (transformers-neuronx
  compiles the context kernel for batch 1 under continuous batching: k rows cost
  k x prefill_s(1, prompt)); their first tokens are out when all of the step's prefills
  are done; then (2) decodes every live slot, the new ones included: decode_s(live). A
  request frees its slot the moment it ends.
- `ideal`: the same slot scheduler with a batched context kernel and no budget: all the
  rows joining in a step are prefilled together, prefill_s(k, longest prompt). What
  continuous batching could give with a context kernel compiled for several rows; the
  `slots` policy of earlier versions.
- `static`: TorchServe's frontend batching + one micro-batch at a time (`scheduler.mode:
  static`): a free worker takes the queued requests, waits up to `max_batch_delay` for
  `batch_size` of them, prefills them one row at a time (as the static engine does on sim
  and neuronx: k rows cost k x prefill_s(1, prompt), every first token out when all are
  done) and decodes until the batch's longest request ends (live rows charged); new
  arrivals wait for the whole micro-batch.

Loads, as scripts/bench/client.py sends them: `synchronous` (one stream), `concurrent` (S
streams, each sending its next request the instant the last one ends), `poisson` and
`constant` (open arrivals at a rate, the client's own arrival times: same seed, same
times). Each simulated load is summarised by bench_stats.summarize, the served loads'
arithmetic: TTFT, ITL, output tok/s over first request sent -> last response ended.

Capacity (req/s) is the `continuous` policy's saturated throughput for the workload's
lengths: every request of a long run queued at t = 0, requests completed / time. With all
slots refilled in one step (budget >= n_slots x prompt) it is exactly
1 / (prefill_s(1, P) + (N - 1) x decode_s(n_slots) / n_slots). `make bench` offers both
modes the same fractions of this one capacity.

    python -m scripts.bench.des --profile profiles/llama-2-7b-inf2-48xl-tp24.yaml
    python -m scripts.bench.des --profile ... --sweep 0.1,0.5,0.9 --json out.json
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from handler.backends.sim_profile import Profile, load_profile
from handler.engine.scheduler import SlotScheduler
from scripts.bench.stats import LoadSummary, arrival_offsets, summarize

PolicyKind = Literal["continuous", "ideal", "static"]
POLICIES: tuple[PolicyKind, ...] = ("continuous", "ideal", "static")
DEFAULT_BUDGET = 2048
DEFAULT_MAX_BATCH_DELAY_S = 0.020
UNBOUNDED_BUDGET = 2**62  # `ideal`: no prefill token budget
ARRIVAL_SEED = 2  # scripts/bench/client.py draws a load's arrival times with Random(workload seed + 2)


# -- what is simulated -------------------------------------------------------------------
@dataclass(frozen=True)
class Policy:
    kind: PolicyKind
    n_slots: int  # continuous / ideal: slots; static: batchSize = micro_batch_size
    prefill_token_budget: int = DEFAULT_BUDGET  # continuous only
    max_batch_delay_s: float = DEFAULT_MAX_BATCH_DELAY_S  # static only

    def describe(self) -> str:
        if self.kind == "continuous":
            return f"continuous ({self.n_slots} slots, single-row prefill, budget {self.prefill_token_budget})"
        if self.kind == "ideal":
            return f"ideal ({self.n_slots} slots, batched prefill, no budget)"
        return f"static (batch {self.n_slots}, max batch delay {self.max_batch_delay_s * 1000:g} ms)"


@dataclass(frozen=True)
class Shape:
    """Request lengths: prompt tokens from a normal distribution (mean, spread) like the
    client's, fixed output tokens."""

    prompt_tokens: int
    output_tokens: int
    prompt_spread: int = 0
    seed: int = 0


@dataclass(frozen=True)
class Load:
    """A load in scripts/bench/client.py's terms: synchronous | concurrent | constant | poisson."""

    kind: str
    requests: int
    streams: int = 1
    rate: float = 0.0  # req/s, constant / poisson
    times: tuple[float, ...] | None = None  # explicit arrival times (an open load), overriding kind
    arrival_seed: int = ARRIVAL_SEED

    @property
    def closed(self) -> bool:
        return self.times is None and self.kind in ("synchronous", "concurrent")

    def arrival_times(self) -> list[float]:
        if self.times is not None:
            return list(self.times)
        return arrival_offsets(self.kind, self.rate, self.requests, self.arrival_seed)


@dataclass(frozen=True)
class Request:
    arrival: float
    prompt_tokens: int
    output_tokens: int


@dataclass
class Served:
    """One request's life in the simulation (seconds)."""

    request: Request
    first_token: float = math.nan
    finished: float = math.nan

    @property
    def ttft(self) -> float:
        return self.first_token - self.request.arrival

    def as_bench_request(self) -> dict[str, Any]:
        """The shape bench_stats.summarize reads (scripts/bench/client.py's RequestResult)."""
        return {
            "scheduled": self.request.arrival,
            "started": self.request.arrival,
            "first_token": self.first_token,
            "last_token": self.finished,
            "ended": self.finished,
            "prompt_tokens": self.request.prompt_tokens,
            "completion_tokens": self.request.output_tokens,
            "error": None,
        }


class _Arrivals:
    """Requests not yet arrived: an open load's fixed times, or a closed load's streams
    (each stream's next request arrives the instant its last one ends)."""

    def __init__(self, load: Load, shape: Shape) -> None:
        self._rng = random.Random(shape.seed + 1)
        self._shape = shape
        self._open: deque[Request] = deque()  # fixed times, sorted
        self._follow: list[tuple[float, int, Request]] = []  # a closed load's next requests (heap)
        self._seq = 0
        if load.closed:
            first = min(load.streams, load.requests)
            self._follow_ups = load.requests - first
            for _ in range(first):
                self._push(0.0)
        else:
            self._follow_ups = 0
            self._open.extend(self._make(t) for t in sorted(load.arrival_times()[: load.requests]))

    def _make(self, t: float) -> Request:
        s = self._shape
        prompt = round(self._rng.gauss(s.prompt_tokens, s.prompt_spread)) if s.prompt_spread else s.prompt_tokens
        return Request(t, max(1, prompt), max(1, s.output_tokens))

    def _push(self, t: float) -> None:
        heapq.heappush(self._follow, (t, self._seq, self._make(t)))
        self._seq += 1

    def due(self, now: float) -> list[Request]:
        out = []
        while self._open and self._open[0].arrival <= now:
            out.append(self._open.popleft())
        while self._follow and self._follow[0][0] <= now:
            out.append(heapq.heappop(self._follow)[2])
        return sorted(out, key=lambda r: r.arrival) if len(out) > 1 else out

    def next_time(self) -> float | None:
        heads = ([self._open[0].arrival] if self._open else []) + ([self._follow[0][0]] if self._follow else [])
        return min(heads) if heads else None

    def first_times(self, k: int) -> list[float]:
        """The next `k` arrival times (fewer when fewer are known)."""
        opened = [self._open[i].arrival for i in range(min(k, len(self._open)))]
        return sorted(opened + [t for t, _, _ in heapq.nsmallest(k, self._follow)])[:k]

    def ended(self, t: float) -> None:
        if self._follow_ups > 0:
            self._follow_ups -= 1
            self._push(t)


# -- the policies ------------------------------------------------------------------------
def simulate(profile: Profile, policy: Policy, load: Load, shape: Shape) -> list[Served]:
    """Every request of `load`, served by `policy` on `profile`, in arrival order."""
    arrivals = _Arrivals(load, shape)
    if policy.kind == "static":
        served = _static(profile, policy, arrivals)
    else:
        batched = policy.kind == "ideal"
        budget = UNBOUNDED_BUDGET if batched else policy.prefill_token_budget
        served = _slots(profile, policy.n_slots, budget, batched, arrivals)
    return sorted(served, key=lambda s: s.request.arrival)


def _slots(profile: Profile, n_slots: int, budget: int, batched: bool, arrivals: _Arrivals) -> list[Served]:
    """The engine's step structure under a virtual clock, with admission by the engine's own
    `SlotScheduler` (handler/engine/scheduler.py), not a copy of it: each step prefills what
    the scheduler admits, then decodes every live row; a row frees its slot the moment it ends."""
    scheduler: SlotScheduler[Served] = SlotScheduler(n_slots, budget)
    now, done = 0.0, []
    live: dict[str, list[Any]] = {}  # request id -> [served, tokens still to generate], admission order
    ids = itertools.count()

    def end(request_id: str, t: float) -> None:
        served = live.pop(request_id)[0]
        served.finished = t
        done.append(served)
        scheduler.finish(request_id)
        arrivals.ended(t)

    while True:
        for request in arrivals.due(now):
            scheduler.add(str(next(ids)), request.prompt_tokens, Served(request))
        if scheduler.idle:
            t = arrivals.next_time()
            if t is None:
                return done
            now = t
            continue
        joining = scheduler.schedule()
        if joining:
            prompts = [a.item.request.prompt_tokens for a in joining]
            if batched:
                now += profile.prefill_s(len(joining), max(prompts))
            else:
                now += sum(profile.prefill_s(1, prompt) for prompt in prompts)
            for admitted in joining:  # first tokens: when the step's prefills are done
                admitted.item.first_token = now
                live[admitted.request_id] = [admitted.item, admitted.item.request.output_tokens - 1]
                if admitted.item.request.output_tokens <= 1:
                    end(admitted.request_id, now)
        if not live:
            continue
        # Decode steps of every live row. Until a row ends, or (with a slot free) a request
        # arrives, every step is the same: take them in one go (same arithmetic as one at a time).
        step = profile.decode_s(len(live))
        run = min(left for _, left in live.values())
        now += step
        steps = 1
        free = scheduler.occupied < n_slots
        if not (scheduler.waiting and free):
            while steps < run:
                t = arrivals.next_time() if free else None
                if t is not None and t <= now:
                    break
                now += step
                steps += 1
        for request_id, row in list(live.items()):
            row[1] -= steps
            if row[1] <= 0:
                end(request_id, now)


def _static(profile: Profile, policy: Policy, arrivals: _Arrivals) -> list[Served]:
    b, delay = policy.n_slots, policy.max_batch_delay_s
    now, done = 0.0, []
    queue: deque[Request] = deque()
    while True:
        queue.extend(arrivals.due(now))
        if not queue:
            t = arrivals.next_time()
            if t is None:
                return done
            now = t
            continue
        # The worker takes the first queued request, then waits up to the delay for a full
        # batch. Nothing runs meanwhile, so every arrival before the deadline is known now.
        close = now
        if len(queue) < b:
            need = b - len(queue)
            upcoming = [t for t in arrivals.first_times(need) if t <= now + delay]
            close = upcoming[-1] if len(upcoming) == need else now + delay
            queue.extend(arrivals.due(close))
        rows = sorted((queue.popleft() for _ in range(min(b, len(queue)))), key=lambda r: r.output_tokens)
        first = t = close + sum(profile.prefill_s(1, r.prompt_tokens) for r in rows)
        steps, i = 0, 0
        while i < len(rows):  # decode until the longest ends, charging the rows still live
            step = profile.decode_s(len(rows) - i)
            while steps < rows[i].output_tokens - 1:
                t += step
                steps += 1
            while i < len(rows) and rows[i].output_tokens - 1 == steps:
                done.append(Served(rows[i], first_token=first, finished=t))
                arrivals.ended(t)
                i += 1
        now = t


# -- summaries ---------------------------------------------------------------------------
def summarize_served(name: str, load: Load, served: Sequence[Served]) -> LoadSummary:
    """bench_stats' summary of a simulated load (no per-request list kept)."""
    summary = summarize(name, load.kind, load.streams, load.rate, [s.as_bench_request() for s in served])
    summary.requests = []
    return summary


def run(profile: Profile, policy: Policy, load: Load, shape: Shape, name: str = "") -> LoadSummary:
    return summarize_served(name or f"{policy.kind} {load.kind}", load, simulate(profile, policy, load, shape))


def saturated_rate(profile: Profile, policy: Policy, shape: Shape, rounds: int = 50) -> float:
    """Requests/s with the queue never empty: `rounds` x n_slots requests queued at t = 0."""
    n = rounds * policy.n_slots
    fixed = Shape(shape.prompt_tokens, shape.output_tokens)
    served = simulate(profile, policy, Load("poisson", n, times=(0.0,) * n), fixed)
    return n / max(s.finished for s in served)


def capacity(profile: Profile, shape: Shape, n_slots: int, prefill_token_budget: int = DEFAULT_BUDGET) -> float:
    """The load scale of `make bench`: the continuous policy's saturated req/s."""
    return saturated_rate(profile, Policy("continuous", n_slots, prefill_token_budget), shape)


def scaled(profile: Profile, factor: float) -> Profile:
    """The profile with every time multiplied by `factor` (the sim backend's time_scale)."""
    if factor == 1.0:
        return profile
    return profile.model_copy(
        update={
            "decode_step_ms": {k: v * factor for k, v in profile.decode_step_ms.items()},
            "prefill_ms": {k: v * factor for k, v in profile.prefill_ms.items()},
        }
    )


# -- the reference for one workload ------------------------------------------------------
@dataclass
class Reference:
    """DES figures for the bench's standard workload, per policy."""

    capacity_req_per_s: float
    saturated_req_per_s: dict[str, float]
    idle: dict[str, LoadSummary]  # synchronous
    concurrent: dict[str, LoadSummary]  # `streams` streams, `rounds` requests each
    loaded: dict[float, dict[str, LoadSummary]]  # Poisson at fraction x capacity
    streams: int
    policies: dict[str, Policy] = field(default_factory=dict)

    def ttft_p50_ms(self, fraction: float, policy: str) -> float:
        return self.loaded[fraction][policy].ttft_ms.p50

    def p3(self, policy: str, fraction: float) -> float:
        return self.ttft_p50_ms(fraction, policy) / self.idle[policy].ttft_ms.p50

    def p4(self, fraction: float) -> float:
        return self.ttft_p50_ms(fraction, "static") / self.ttft_p50_ms(fraction, "continuous")

    def to_dict(self) -> dict[str, Any]:
        return {
            "capacity_req_per_s": self.capacity_req_per_s,
            "saturated_req_per_s": self.saturated_req_per_s,
            "streams": self.streams,
            "policies": {k: vars(p) for k, p in self.policies.items()},
            "idle": {k: s.to_dict() for k, s in self.idle.items()},
            "concurrent": {k: s.to_dict() for k, s in self.concurrent.items()},
            "loaded": {str(f): {k: s.to_dict() for k, s in by.items()} for f, by in self.loaded.items()},
        }


def reference(
    profile: Profile,
    shape: Shape,
    n_slots: int | None = None,
    prefill_token_budget: int = DEFAULT_BUDGET,
    max_batch_delay_s: float = DEFAULT_MAX_BATCH_DELAY_S,
    fractions: Sequence[float] = (0.5, 0.7),
    streams: int | None = None,
    rounds: int = 10,
    requests: int = 5000,
    idle_requests: int = 20,
    policies: Sequence[PolicyKind] = POLICIES,
) -> Reference:
    """Each policy on: one stream (idle), `streams` concurrent streams x `rounds`, and
    Poisson at each fraction of the continuous capacity (`requests` requests: long-run)."""
    n = n_slots or profile.batch_size
    by_kind = {
        kind: Policy(kind, n, prefill_token_budget=prefill_token_budget, max_batch_delay_s=max_batch_delay_s)
        for kind in policies
    }
    cap = capacity(profile, shape, n, prefill_token_budget)
    b = streams or n

    def each(load: Load) -> dict[str, LoadSummary]:
        return {k: run(profile, p, load, shape, f"{k} {load.kind}") for k, p in by_kind.items()}

    return Reference(
        capacity_req_per_s=cap,
        saturated_req_per_s={k: saturated_rate(profile, p, shape) for k, p in by_kind.items()},
        idle=each(Load("synchronous", idle_requests)),
        concurrent=each(Load("concurrent", b * rounds, streams=b)),
        loaded={f: each(Load("poisson", requests, rate=f * cap)) for f in fractions},
        streams=b,
        policies=by_kind,
    )


def format_reference(ref: Reference, shape: Shape) -> str:
    fractions = sorted(ref.loaded)
    lines = [
        f"capacity {ref.capacity_req_per_s:.3f} req/s (continuous policy saturated, {shape.prompt_tokens} prompt / "
        f"{shape.output_tokens} output tokens); saturated: "
        + ", ".join(f"{k} {v:.3f}" for k, v in ref.saturated_req_per_s.items()),
    ]
    head = f"{'policy':<11} {'idle TTFT':>9} " + " ".join(f"{f'TTFT@{f:.0%}':>9}" for f in fractions)
    head += f" {'ITL@' + format(fractions[-1], '.0%'):>8} {'tok/s@' + str(ref.streams):>9} " + " ".join(
        f"{f'tok/s@{f:.0%}':>10}" for f in fractions
    )
    lines += [head, "-" * len(head)]
    for k in ref.idle:
        row = f"{k:<11} {ref.idle[k].ttft_ms.p50:>9.1f} "
        row += " ".join(f"{ref.loaded[f][k].ttft_ms.p50:>9.1f}" for f in fractions)
        row += f" {ref.loaded[fractions[-1]][k].itl_ms.p50:>8.2f} {ref.concurrent[k].output_tokens_per_s:>9.1f} "
        row += " ".join(f"{ref.loaded[f][k].output_tokens_per_s:>10.1f}" for f in fractions)
        lines.append(row)
    lines.append("(ms; TTFT p50; tok/s = output tokens / (first request sent -> last response ended))")
    return "\n".join(lines)


def budget_study(
    profile: Profile, shape: Shape, n_slots: int, budgets: Sequence[int], loads: Sequence[Load]
) -> dict[str, dict[int, LoadSummary]]:
    """Each load under the continuous policy at each `prefill_token_budget`: what grouping the waiting
    prefills (a larger budget) or spreading them (one prompt per step) does to TTFT and ITL."""
    names = [f"{x.kind}@{x.streams}" if x.closed else f"{x.kind} {x.rate:.3g}/s" for x in loads]
    return {
        name: {b: run(profile, Policy("continuous", n_slots, prefill_token_budget=b), load, shape) for b in budgets}
        for name, load in zip(names, loads, strict=True)
    }


def format_budget_study(study: dict[str, dict[int, LoadSummary]]) -> str:
    head = f"{'load':<22} {'budget':>7} {'tok/s':>7} {'TTFT p50':>9} {'TTFT p90':>9} {'ITL p50':>8} {'ITL p90':>8}"
    lines = [head, "-" * len(head)]
    for name, by_budget in study.items():
        for budget, x in by_budget.items():
            lines.append(
                f"{name:<22} {budget:>7} {x.output_tokens_per_s:>7.1f} {x.ttft_ms.p50:>9.0f} {x.ttft_ms.p90:>9.0f} "
                f"{x.itl_ms.p50:>8.1f} {x.itl_ms.p90:>8.1f}"
            )
    lines.append("(continuous policy; ms; ITL: each request's mean inter-token latency, then p50/p90 over requests)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--policy", choices=POLICIES, action="append", help="default: all three")
    parser.add_argument("--load-fraction", type=float, default=0.7, help="P3's load, of capacity")
    parser.add_argument("--p4-fraction", type=float, default=0.5, help="P4's load, of capacity")
    parser.add_argument("--sweep", type=parse_fractions, default=(), help="more fractions, e.g. 0.1,0.3,0.9")
    parser.add_argument("--rate", type=float, help="also a Poisson load at this rate (req/s)")
    parser.add_argument("--requests", type=int, default=5000, help="per Poisson load")
    parser.add_argument("--streams", type=int, help="concurrent streams (default: n_slots)")
    parser.add_argument("--rounds", type=int, default=10, help="requests per concurrent stream")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--prompt-spread", type=int, default=0)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--n-slots", type=int, help="default: the profile's batch_size")
    parser.add_argument("--prefill-token-budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--max-batch-delay-ms", type=float, default=DEFAULT_MAX_BATCH_DELAY_S * 1000)
    parser.add_argument(
        "--budgets", type=parse_budgets, default=(), help="also each load at these prefill_token_budgets: 1536,4096"
    )
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args(argv)

    profile = load_profile(args.profile)
    shape = Shape(args.prompt_tokens, args.output_tokens, args.prompt_spread)
    fractions = sorted({args.load_fraction, args.p4_fraction, *args.sweep})
    kinds = tuple(dict.fromkeys(args.policy or POLICIES))
    ref = reference(
        profile,
        shape,
        n_slots=args.n_slots,
        prefill_token_budget=args.prefill_token_budget,
        max_batch_delay_s=args.max_batch_delay_ms / 1000,
        fractions=fractions,
        streams=args.streams,
        rounds=args.rounds,
        requests=args.requests,
        policies=kinds,
    )
    print(f"{profile.name}: " + "; ".join(p.describe() for p in ref.policies.values()))
    print(format_reference(ref, shape))
    for k in kinds:
        print(f"{k:>10}: P3 reference {ref.p3(k, args.load_fraction):.2f} at {args.load_fraction:.0%} of capacity")
    if {"static", "continuous"} <= set(kinds):
        print(f"P4 reference (static / continuous TTFT p50 at {args.p4_fraction:.0%}): {ref.p4(args.p4_fraction):.1f}")
    out = ref.to_dict()
    if args.rate:
        load = Load("poisson", args.requests, rate=args.rate)
        at_rate = {k: run(profile, p, load, shape) for k, p in ref.policies.items()}
        out["at_rate"] = {"rate": args.rate, **{k: s.to_dict() for k, s in at_rate.items()}}
        for k, s in at_rate.items():
            print(
                f"{k:>10} at {args.rate:.2f} req/s: TTFT p50 {s.ttft_ms.p50:.1f} ms, ITL p50 {s.itl_ms.p50:.2f} ms, "
                f"{s.output_tokens_per_s:.1f} tok/s"
            )
    if args.budgets:
        n_slots = args.n_slots or profile.batch_size
        loads = [Load("concurrent", (args.streams or n_slots) * args.rounds, args.streams or n_slots)]
        loads += [Load("poisson", args.requests, rate=f * ref.capacity_req_per_s) for f in fractions]
        study = budget_study(profile, shape, n_slots, args.budgets, loads)
        print(format_budget_study(study))
        out["budgets"] = {name: {b: x.to_dict() for b, x in row.items()} for name, row in study.items()}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


def parse_budgets(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"bad budgets {text!r}: use e.g. 1536,2048,4096 (prompt tokens per step)")
    return values


def parse_fractions(text: str) -> tuple[float, ...]:
    """Fractions of capacity for a command line: '0.1,0.5,0.9', or 'none' for no loads."""
    if text.strip().lower() in ("", "none"):
        return ()
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(0 < v < 1.5 for v in values):
        raise argparse.ArgumentTypeError(f"bad fractions {text!r}: use e.g. 0.1,0.5,0.9 (of capacity) or none")
    return values


if __name__ == "__main__":
    main()
