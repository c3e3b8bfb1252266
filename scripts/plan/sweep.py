"""`make plan`'s load sweep: one layout's modelled step times as a sim profile, and the
discrete-event simulation of our continuous scheduler (scripts/bench/des.py, the `continuous`
policy: single-row prefills within `prefill_token_budget`, then a decode of every slot) on
Poisson loads, up to the highest rate that keeps TTFT p90 and ITL p50 within the SLO.

Replicas: the dispatcher sends each new request to the replica with the fewest sequences
(handler/replicas). With identical replicas and requests that is close to round robin, so one
replica is simulated on every R-th arrival of the instance's Poisson stream, and the instance
serves R times its output. Each load is one replica's `requests` requests from an empty
system; its figures are bench_stats.summarize's.

The decode step is charged at the compiled batch (every slot, whatever is live: the static
shapes of a continuous-batching Neuron model) and at the token bucket of the longest row
(prompt + output); a prefill at its prompt bucket (handler/neuron/step_time.py).

Speculation (`--speculation-k`, `--acceptance-rate`): a MODEL, NOT A MEASUREMENT. A verify step is
the step-time model's forward of (k + 1) x n_slots tokens (every compiled slot carries k drafted
tokens and its own; `verify_ms`; `Profile.verify_s` says why a decode, not a prefill), and a row
takes E = (1 - a^(k+1)) / (1 - a) tokens from it on average (`expected_tokens_per_step`). The sweep then
runs the same scheduler with a decode step of verify / E per token (`speculative_profile`): each
request's mean time per output token, what ITL is here (bench_stats' per-request mean), and the
tokens/s follow; the bursts of 1 to k + 1 tokens a real stream gets are averaged out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from handler.backends.sim_profile import Profile, expected_tokens_per_step
from handler.neuron.step_time import Calibration, CoreWork, decode_features, decode_ms, prefill_ms, token_bucket
from scripts.bench import des
from scripts.bench.stats import LoadSummary, arrival_offsets
from scripts.plan.layouts import Workload

FRACTIONS = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)  # of one replica's saturated rate, tried in order
BISECTIONS = 2  # then halve the gap between the last rate within the SLO and the first beyond it, this often
REQUESTS_PER_LOAD = 240  # per simulated replica
# The widest verify a generated profile carries a point for: scheduler.speculation's largest k
# (SpeculationConfig.num_speculative_tokens, at most 8), so the sim charges any k from the model.
WIDEST_DRAFT = 8


@dataclass(frozen=True)
class SLO:
    ttft_p90_ms: float
    itl_p50_ms: float

    def miss(self, s: LoadSummary) -> str | None:
        """What a load misses, or None. A figure that was not measured (NaN) is a miss."""
        out = []
        if not s.ttft_ms.p90 <= self.ttft_p90_ms:
            out.append(f"TTFT p90 {s.ttft_ms.p90:.0f} ms > {self.ttft_p90_ms:g}")
        if not s.itl_ms.p50 <= self.itl_p50_ms:
            out.append(f"ITL p50 {s.itl_ms.p50:.1f} ms > {self.itl_p50_ms:g}")
        return ", ".join(out) or None


def step_profile(
    name: str,
    work: CoreWork,
    cal: Calibration,
    n_slots: int,
    n_positions: int,
    workload: Workload,
    vocab: int,
    buckets: Sequence[int] | None = None,
) -> Profile:
    """The layout's modelled times as a sim profile: what bench_des simulates here, and what the
    shipped sim profiles are (scripts/plan/profiles.py), so the plan and the sim agree.
    `buckets`: the compiled prompt buckets; default the workload's (Workload.buckets)."""
    kv_positions = token_bucket(workload.longest_prompt + workload.output_tokens, n_positions)
    step = round(decode_ms(work, n_slots, kv_positions, cal), 4)
    widest = (WIDEST_DRAFT + 1) * n_slots
    chosen = list(buckets) if buckets else workload.buckets()
    return Profile(
        name=name,
        source="handler/neuron/step_time.py, calibrated on profiles/published-points.yaml",
        batch_size=n_slots,
        n_positions=n_positions,
        vocab_size=max(2, vocab),
        context_buckets=tuple(chosen),
        # every slot computed, live or not; and the widest verify step (k + 1 tokens per slot), which
        # the profile's linear interpolation gives exactly for any narrower one (verify_ms is linear in k)
        decode_step_ms={
            1: step,
            n_slots: step,
            widest: round(verify_ms(work, n_slots, WIDEST_DRAFT, kv_positions, cal), 4),
        },
        prefill_ms=prefill_table(work, cal, n_slots, chosen),
    )


@dataclass(frozen=True)
class Speculation:
    """`--speculation-k` drafted tokens per row and step, each accepted with `--acceptance-rate`."""

    draft_tokens: int
    acceptance: float

    @property
    def tokens_per_step(self) -> float:
        """E: the mean tokens a row takes from one verify step."""
        return expected_tokens_per_step(self.acceptance, self.draft_tokens)

    def verify_ms(self, profile: Profile) -> float:
        """One verify step of every compiled slot (static shapes, as the plain step)."""
        return profile.verify_s(profile.batch_size, self.draft_tokens) * 1000

    def describe(self) -> str:
        return (
            f"k = {self.draft_tokens} drafted tokens per row, each accepted with probability a = {self.acceptance:g}: "
            f"E = (1 - a^(k+1)) / (1 - a) = {self.tokens_per_step:.2f} tokens per row and verify step"
        )


def speculative_profile(profile: Profile, speculation: Speculation) -> Profile:
    """The layout's profile with the decode step replaced by its speculative pace: the verify step
    of every slot divided by the tokens a row takes from it (module docstring). Prefills unchanged."""
    per_token = round(speculation.verify_ms(profile) / speculation.tokens_per_step, 4)
    return profile.model_copy(
        update={
            "name": f"{profile.name}, speculation k={speculation.draft_tokens} a={speculation.acceptance:g}",
            "decode_step_ms": {1: per_token, profile.batch_size: per_token},
        }
    )


def verify_ms(work: CoreWork, rows: int, draft_tokens: int, kv_positions: float, cal: Calibration) -> float:
    """The step-time model's verify step: one forward of draft_tokens + 1 tokens for each of `rows`
    rows. Its decode terms, each counted as a verify pays it: the weights are read once, as in any
    decode step; each row's cache once (its k + 1 queries attend to the same positions, read as one
    stream of tiles); the per-layer costs once; the per-row overhead (the logits, the sampling and
    the per-row work around the attention, fitted on one-token rows) per token, k + 1 times a row.
    So decode(rows) + k x rows x row_overhead. Not a prefill: handler/backends/sim_profile.py's
    `Profile.verify_s` says why. No published Inferentia2 verify step calibrates it, and the model has
    no compute term (a decode step is bound by HBM): at 32 slots and k = 8 an 8B model's matrix FLOPs
    at the prefill's fitted efficiency (about 14 ms at TP8) stay below the per-token overheads charged."""
    weights, kv, layers, per_row, int8 = decode_features(work, rows, kv_positions)
    features = (weights, kv, layers, per_row * (draft_tokens + 1), int8)
    return sum(f * c for f, c in zip(features, cal.decode_coefficients(), strict=True))


def prefill_table(work: CoreWork, cal: Calibration, n_slots: int, buckets: Sequence[int]) -> dict[int, float]:
    """Profile.prefill_ms (keyed by rows x bucket, interpolated linearly): one row at each bucket,
    exact for the single-row prefills the sim and the continuous policy charge; and n_slots rows
    at the largest bucket, so that a prefill of several rows at once (the DES's ideal policy)
    interpolates toward the model instead of extrapolating the last two one-row points."""
    table = {b: round(prefill_ms(work, 1, b, cal), 4) for b in buckets}
    if n_slots > 1:
        table[n_slots * buckets[-1]] = round(prefill_ms(work, n_slots, buckets[-1], cal), 4)
    return table


@dataclass
class LoadPoint:
    rate: float  # the instance's offered req/s
    replicas: int
    summary: LoadSummary  # one replica's
    miss: str | None

    @property
    def tokens_per_s(self) -> float:
        return self.summary.output_tokens_per_s * self.replicas


@dataclass
class Sweep:
    points: list[LoadPoint] = field(default_factory=list)

    @property
    def best(self) -> LoadPoint | None:
        within = [p for p in self.points if p.miss is None]
        return max(within, key=lambda p: p.rate) if within else None

    @property
    def first_miss(self) -> str | None:
        ordered = sorted(self.points, key=lambda p: p.rate)
        return ordered[0].miss if ordered else None


def replica_capacity(profile: Profile, workload: Workload) -> float:
    """One replica's saturated req/s in closed form: every prefill stalls the replica's decode and
    every slot is refilled as it ends, so a request costs its prefill plus its share of the decode
    steps, 1 / (prefill(1 row, prompt) + (output - 1) x decode(n_slots) / n_slots). An upper bound
    of what bench_des.capacity simulates, and no simulation: the sweep's loads are its fractions."""
    n = profile.batch_size
    per_request = profile.prefill_s(1, workload.prompt_tokens) + (workload.output_tokens - 1) * profile.decode_s(n) / n
    return 1 / per_request


def run_load(
    profile: Profile,
    replicas: int,
    rate: float,
    workload: Workload,
    budget: int = des.DEFAULT_BUDGET,
    requests: int = REQUESTS_PER_LOAD,
    seed: int = 0,
) -> LoadSummary:
    """One replica of `replicas` on every R-th arrival of a Poisson stream at `rate` (the instance's)."""
    times = arrival_offsets("poisson", rate, requests * replicas, seed + des.ARRIVAL_SEED)[::replicas]
    load = des.Load("poisson", len(times), rate=rate / replicas, times=tuple(t - times[0] for t in times))
    shape = des.Shape(workload.prompt_tokens, workload.output_tokens, workload.prompt_spread, seed)
    policy = des.Policy("continuous", profile.batch_size, prefill_token_budget=budget)
    return des.summarize_served(f"{rate:.3g} req/s", load, des.simulate(profile, policy, load, shape))


def sweep(
    profile: Profile,
    replicas: int,
    workload: Workload,
    slo: SLO,
    fractions: Sequence[float] = FRACTIONS,
    bisections: int = BISECTIONS,
    budget: int = des.DEFAULT_BUDGET,
    requests: int = REQUESTS_PER_LOAD,
) -> Sweep:
    """Rates in order of `fractions` of the capacity until one misses the SLO, then bisect."""
    capacity = replica_capacity(profile, workload) * replicas
    result = Sweep()

    def at(fraction: float) -> LoadPoint:
        rate = fraction * capacity
        summary = run_load(profile, replicas, rate, workload, budget, requests)
        point = LoadPoint(rate, replicas, summary, slo.miss(summary))
        result.points.append(point)
        return point

    low, high = 0.0, None
    for fraction in fractions:
        if at(fraction).miss is not None:
            high = fraction
            break
        low = fraction
    if high is not None and low > 0:
        for _ in range(bisections):
            middle = (low + high) / 2
            if at(middle).miss is None:
                low = middle
            else:
                high = middle
    return result


# Prefills a step may hold, in prompts of the workload's longest length: the budgets tried for the
# winner (scheduler.prefill_token_budget). One per step bounds the running streams' pause to one
# prefill; more admits a burst sooner but pauses them for several.
BUDGET_PROMPTS = (1, 2, 4, 8)


@dataclass(frozen=True)
class BudgetTrial:
    budget: int  # prompt tokens per step
    prompts: int  # of the longest prompt
    sweep: Sweep

    @property
    def best(self) -> LoadPoint | None:
        return self.sweep.best


def choose_budget(
    profile: Profile,
    replicas: int,
    workload: Workload,
    slo: SLO,
    requests: int = REQUESTS_PER_LOAD,
    prompts: Sequence[int] = BUDGET_PROMPTS,
) -> tuple[BudgetTrial | None, list[BudgetTrial]]:
    """Each budget's sweep; the chosen one serves the highest rate within the SLO, then has the
    lowest TTFT p90 there, then is the smallest. None when no budget meets the SLO."""
    trials = [
        BudgetTrial(
            k * workload.longest_prompt,
            k,
            sweep(profile, replicas, workload, slo, budget=k * workload.longest_prompt, requests=requests),
        )
        for k in prompts
    ]
    within = [t for t in trials if t.best is not None]
    if not within:
        return None, trials
    chosen = max(within, key=lambda t: (round(t.best.rate, 6), -t.best.summary.ttft_ms.p90, -t.budget))  # type: ignore[union-attr]
    return chosen, trials


def format_budgets(chosen: BudgetTrial | None, trials: Sequence[BudgetTrial]) -> str:
    lines = ["scheduler.prefill_token_budget for the winner (the same sweep at each budget):"]
    for t in trials:
        b = t.best
        figures = (
            f"up to {b.rate:.3g} req/s, TTFT p90 {b.summary.ttft_ms.p90:.0f} ms, ITL p50 {b.summary.itl_ms.p50:.1f} ms"
            if b
            else "misses the SLO at every load"
        )
        mark = "  <- chosen" if t is chosen else ""
        lines.append(f"  {t.budget:>6} ({t.prompts} prompt{'s' if t.prompts > 1 else ''} per step): {figures}{mark}")
    return "\n".join(lines)
