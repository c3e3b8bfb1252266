"""`make plan`'s output: the layouts ranked (best first: the lowest cost per million output
tokens among those meeting the SLO, then why each other one lost), the model-config.yaml snippet
of the winner, the PNG of throughput against ITL for the top layouts, and, with --speculation-k,
the top layouts with speculative decoding modelled (labelled a model, not a measurement)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from scripts.plan.layouts import Candidate, Workload
from scripts.plan.sweep import SLO, LoadPoint, Speculation, Sweep

MODEL_NOT_MEASUREMENT = "a model, not a measurement"


@dataclass
class Outcome:
    """One layout: why it cannot load, or its modelled steps and its sweep (or why it was not swept)."""

    candidate: Candidate
    no_fit: str | None = None
    decode_ms: float = 0.0
    prefill_ms: float = 0.0  # one prompt at the workload's length (its bucket)
    sweep: Sweep | None = None
    miss: str | None = None  # misses the SLO at any load: why
    most_positions: int = 0
    near_hbm_limit: bool = False  # fits, within 5 % of the HBM (the runtime reserve is an assumption)

    @property
    def best(self) -> LoadPoint | None:
        return self.sweep.best if self.sweep else None

    @property
    def usd_per_million(self) -> float:
        best = self.best
        if best is None or best.tokens_per_s <= 0:
            return float("inf")
        return self.candidate.instance.usd_per_hour / (best.tokens_per_s * 3600) * 1e6


@dataclass
class SpeculativeOutcome:
    """One layout with speculation modelled: its plain outcome, the same layout swept at the
    speculative pace (`modelled.decode_ms` is the verify step / E, per token), and the verify step."""

    plain: Outcome
    modelled: Outcome
    verify_ms: float  # one verify step of every compiled slot, k + 1 tokens each


def rank(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """Meeting the SLO, cheapest per token first (then the lower ITL); then those missing it; then
    those that do not fit."""

    def key(o: Outcome) -> tuple[int, float, float, tuple[float, int, int]]:
        c = o.candidate
        order = (c.instance.usd_per_hour, c.tp_degree, c.n_slots)
        if o.no_fit:
            return 2, 0.0, 0.0, order
        if o.best is None:
            return 1, 0.0, 0.0, order
        return 0, o.usd_per_million, o.best.summary.itl_ms.p50, order

    return sorted(outcomes, key=key)


def format_ranking(ranked: Sequence[Outcome], slo: SLO, top: int) -> str:
    winners = [o for o in ranked if o.best is not None]
    head = (
        f"{'#':>3} {'instance':<13} {'R x TP':>7} {'slots':>5} {'n_pos':>6} {'step ms':>7} {'prefill':>7} "
        f"{'req/s':>6} {'tok/s':>7} {'TTFT p90':>8} {'ITL p50':>7} {'$/M tok':>8}  verdict"
    )
    lines = [head, "-" * len(head)]
    best_cost = winners[0].usd_per_million if winners else 0.0
    for i, o in enumerate(winners[:top], 1):
        c, b = o.candidate, o.best
        assert b is not None
        verdict = "WINNER" if i == 1 else f"costlier (+{o.usd_per_million / best_cost - 1:.0%})"
        if o.near_hbm_limit:
            verdict += ", HBM within 5 %"
        lines.append(
            f"{i:>3} {c.instance.name:<13} {f'{c.replicas}x{c.tp_degree}':>7} {c.n_slots:>5} {c.n_positions:>6} "
            f"{o.decode_ms:>7.1f} {o.prefill_ms:>7.0f} {b.rate:>6.2f} {b.tokens_per_s:>7.0f} "
            f"{b.summary.ttft_ms.p90:>8.0f} {b.summary.itl_ms.p50:>7.1f} {o.usd_per_million:>8.2f}  {verdict}"
        )
    if len(winners) > top:
        lines.append(f"    ... {len(winners) - top} more meet the SLO at a higher cost (--top to list them)")
    if not winners:
        lines.append(
            f"    no layout meets TTFT p90 <= {slo.ttft_p90_ms:g} ms and ITL p50 <= {slo.itl_p50_ms:g} ms at any load"
        )
    lines.append("(step: one decode of every slot; prefill: one prompt; req/s, tok/s: the highest load within the SLO,")
    lines.append(" the whole instance; TTFT p90 and ITL p50 at that load; $/M tok: on-demand price per million output)")
    return "\n".join(lines)


def format_losers(ranked: Sequence[Outcome]) -> str:
    """The layouts that lost other than on cost, grouped where the reason is the same: those that
    cannot load (by tp_degree and limit, with the smallest slot count's numbers), then those that
    miss the SLO at every load (by tp_degree and slots)."""
    groups: dict[tuple[str, int, str], list[Outcome]] = {}
    for o in ranked:
        if o.best is not None:
            continue
        c = o.candidate
        if o.no_fit and o.no_fit.startswith("HBM"):
            key = ("hbm", c.tp_degree, "")  # the instance does not matter
        elif o.no_fit:
            key = ("host", c.tp_degree, c.instance.name)
        else:
            key = ("miss", c.tp_degree, f"{c.n_slots} {o.miss}")
        groups.setdefault(key, []).append(o)
    if not groups:
        return ""
    lines = ["Lost:"]
    for (kind, tp, _), members in sorted(groups.items(), key=lambda item: (item[0][0] == "miss", item[0][1])):
        first = min(members, key=lambda o: o.candidate.n_slots)
        instances = ", ".join(dict.fromkeys(o.candidate.instance.name for o in members))
        slots = ",".join(str(n) for n in sorted({o.candidate.n_slots for o in members}))
        if kind == "miss":
            n = first.candidate.n_slots
            lines.append(
                f"  TP{tp} x {n} slot{'s' if n > 1 else ''} ({instances}): misses the SLO at any load: {first.miss}"
            )
        else:
            lines.append(f"  TP{tp}, slots {slots} ({instances}): does not fit: {first.no_fit}")
    return "\n".join(lines)


def format_speculation(rows: Sequence[SpeculativeOutcome], speculation: Speculation, slo: SLO) -> str:
    """The top layouts again, with speculation modelled, beside their plain figures."""
    lines = [
        f"Speculative decoding, {MODEL_NOT_MEASUREMENT.upper()}: {speculation.describe()}.",
        f"verify: the step-time model's forward of (k + 1) x slots = {speculation.draft_tokens + 1} x slots tokens "
        "(weights and each row's cache read once, the per-row overhead per token); ms/tok = verify / E;",
        "swept as above at that pace. No published Inferentia2 verify step or acceptance rate calibrates it.",
    ]
    head = (
        f"{'#':>3} {'instance':<13} {'R x TP':>7} {'slots':>5} {'step ms':>7} {'verify':>7} {'ms/tok':>6} "
        f"{'req/s':>6} {'tok/s':>7} {'TTFT p90':>8} {'ITL p50':>7} {'$/M tok':>8}  vs plain (tok/s, ITL p50)"
    )
    lines += [head, "-" * len(head)]
    for i, row in enumerate(rows, 1):
        c, m, b = row.plain.candidate, row.modelled, row.modelled.best
        start = (
            f"{i:>3} {c.instance.name:<13} {f'{c.replicas}x{c.tp_degree}':>7} {c.n_slots:>5} "
            f"{row.plain.decode_ms:>7.1f} {row.verify_ms:>7.1f} {m.decode_ms:>6.1f}"
        )
        if b is None:
            lines.append(f"{start}  misses the SLO at any load: {m.miss}")
            continue
        lines.append(
            f"{start} {b.rate:>6.2f} {b.tokens_per_s:>7.0f} {b.summary.ttft_ms.p90:>8.0f} "
            f"{b.summary.itl_ms.p50:>7.1f} {m.usd_per_million:>8.2f}  {_versus(row.plain.best, b)}"
        )
    if not rows:
        lines.append("    no layout fits: nothing to model")
    lines.append(
        "(step: the plain decode of every slot; verify: the speculative step; ms/tok: its pace per token;"
        " the rest as in the ranking, at the same budget and SLO;"
    )
    lines.append(" the ranking and the snippet stay the plain plan's: neuronx serves no scheduler.speculation)")
    return "\n".join(lines)


def _versus(plain: LoadPoint | None, modelled: LoadPoint) -> str:
    if plain is None:
        return "plain misses the SLO"
    tokens = modelled.tokens_per_s / plain.tokens_per_s - 1
    itl = modelled.summary.itl_ms.p50 / plain.summary.itl_ms.p50 - 1
    return f"{tokens:+.0%}, {itl:+.0%}"


def speculation_report(rows: Sequence[SpeculativeOutcome], speculation: Speculation) -> dict[str, object]:
    """What plan-<model>.json holds under "speculation"."""
    layouts = []
    for row in rows:
        c, m, b = row.plain.candidate, row.modelled, row.modelled.best
        entry: dict[str, object] = {
            "instance": c.instance.name,
            "tp_degree": c.tp_degree,
            "replicas": c.replicas,
            "n_slots": c.n_slots,
            "step_ms": round(row.plain.decode_ms, 3),
            "verify_ms": round(row.verify_ms, 3),
            "ms_per_token": round(m.decode_ms, 3),
            "miss": m.miss,
        }
        if b is not None:
            entry |= {
                "req_per_s": round(b.rate, 4),
                "tokens_per_s": round(b.tokens_per_s, 1),
                "ttft_p90_ms": round(b.summary.ttft_ms.p90, 1),
                "itl_p50_ms": round(b.summary.itl_ms.p50, 2),
                "usd_per_million_tokens": round(m.usd_per_million, 4),
            }
        layouts.append(entry)
    return {
        "kind": MODEL_NOT_MEASUREMENT,
        "draft_tokens": speculation.draft_tokens,
        "acceptance_rate": speculation.acceptance,
        "tokens_per_step": round(speculation.tokens_per_step, 4),
        "verify": "the step-time model's forward of (k + 1) x n_slots tokens (scripts/plan/sweep.py verify_ms)",
        "layouts": layouts,
    }


def config_snippet(
    o: Outcome, workload: Workload, model: str, backend: str = "neuronx", prefill_token_budget: int = 2048
) -> str:
    c = o.candidate
    slots = c.replicas * c.n_slots
    buckets = workload.buckets()
    amp = "bf16" if c.weight_dtype in ("bf16", "int8") else c.weight_dtype
    quantize = '\n    quantize_weights: "s8"          # int8 weights, as planned' if c.weight_dtype == "int8" else ""
    bucket_key = "context_length_estimate" if backend == "neuronx" else "context_buckets"
    b = o.best
    assert b is not None
    ttft, itl = b.summary.ttft_ms.p90, b.summary.itl_ms.p50
    return f"""# make plan: {model} on {c.instance.name}, {c.replicas} x TP{c.tp_degree} x {c.n_slots} slots;
# modelled up to {b.rate:.2f} req/s ({b.tokens_per_s:.0f} output tok/s) with TTFT p90 {ttft:.0f} ms and
# ITL p50 {itl:.1f} ms for {workload.prompt_tokens}-token prompts and {workload.output_tokens} output tokens.
minWorkers: 1
maxWorkers: 1
continuousBatching: true
batchSize: {2 * slots}            # 2 x replicas x n_slots
jobQueueSize: {4 * slots}         # 4 x replicas x n_slots
maxBatchDelay: 1
responseTimeout: 300
startupTimeout: 3600
handler:
  model_checkpoint_dir: "model"
  backend: "{backend}"
  amp: "{amp}"
  tp_degree: {c.tp_degree}
  n_positions: {c.n_positions}
  default_max_new_tokens: {workload.output_tokens}
  max_new_tokens: {c.n_positions - buckets[-1]}
  {backend}:
    {bucket_key}: {buckets}{quantize}
scheduler:
  mode: "continuous"
  n_slots: {c.n_slots}
  replicas: {c.replicas}
  prefill_token_budget: {prefill_token_budget}
  overlap: true
"""


def plot(ranked: Sequence[Outcome], slo: SLO, path: Path, title: str, top: int = 5) -> Path | None:
    """Output tok/s (whole instance) against ITL p50 over each top layout's sweep."""
    shown = [o for o in ranked if o.sweep and o.sweep.points][:top]
    if not shown:
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    for o in shown:
        points = sorted(o.sweep.points, key=lambda p: p.rate)  # type: ignore[union-attr]
        label = f"{o.candidate.label()}" + (f", ${o.usd_per_million:.2f}/M" if o.best else "")
        ax.plot([p.summary.itl_ms.p50 for p in points], [p.tokens_per_s for p in points], "o-", label=label)
        missed = [p for p in points if p.miss]
        ax.plot([p.summary.itl_ms.p50 for p in missed], [p.tokens_per_s for p in missed], "x", color="k", markersize=7)
        if o.best:
            ax.plot([o.best.summary.itl_ms.p50], [o.best.tokens_per_s], "k*", markersize=12)
    ax.axvline(slo.itl_p50_ms, color="grey", linestyle="--", label=f"ITL SLO {slo.itl_p50_ms:g} ms")
    ax.plot([], [], "x", color="k", label="load beyond the SLO (TTFT or ITL)")
    ax.plot([], [], "k*", label="highest load within the SLO")
    ax.set_xlabel("ITL p50 (ms)")
    ax.set_ylabel("output tokens/s (instance)")
    ax.set_title(title, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
