"""The benchmark PNGs: one load series (TTFT and ITL, and throughput, against offered load;
scripts/bench/client.py), and `make bench`'s sweep (one curve per scheduler mode, with its limit)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from scripts.bench.stats import LoadSummary, SweepPoint


def plot_summaries(summaries: Sequence[LoadSummary], path: Path, title: str = "") -> Path:
    ordered = sorted(summaries, key=lambda s: s.offered_rate)
    x = [s.offered_rate for s in ordered]
    fig, (latency_ax, throughput_ax) = plt.subplots(1, 2, figsize=(11, 4.2))
    latency_ax.plot(x, [s.ttft_ms.p50 for s in ordered], "o-", label="TTFT p50")
    latency_ax.plot(x, [s.ttft_ms.p90 for s in ordered], "o--", label="TTFT p90")
    latency_ax.plot(x, [s.itl_ms.p50 for s in ordered], "s-", label="ITL p50")
    latency_ax.set_yscale("log")
    latency_ax.set_xlabel("offered load (req/s)")
    latency_ax.set_ylabel("ms")
    latency_ax.set_title("latency")
    latency_ax.legend()
    throughput_ax.plot(x, [s.output_tokens_per_s for s in ordered], "o-")
    for s in ordered:
        throughput_ax.annotate(s.name, (s.offered_rate, s.output_tokens_per_s), fontsize=7)
    throughput_ax.set_xlabel("offered load (req/s)")
    throughput_ax.set_ylabel("output tokens/s")
    throughput_ax.set_title("throughput")
    for ax in (latency_ax, throughput_ax):
        ax.grid(True, alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


MODE_COLORS = {"continuous": "tab:blue", "static": "tab:red"}
Knees = Mapping[str, Mapping[str, float | None]]  # mode -> {"p50": fraction or None, "p90": ...}


def plot_sweep(
    curves: Mapping[str, Sequence[SweepPoint]],
    path: Path,
    capacity: float,
    title: str = "",
    limits: Mapping[str, Sequence[SweepPoint]] | None = None,
    long_run: Mapping[str, Sequence[SweepPoint]] | None = None,
    knees: Knees | None = None,
) -> Path:
    """The sweep against offered load (% of `capacity` req/s), one colour per mode: TTFT
    p50 and p90 (log), ITL p50 and output tok/s. Measured: solid with dots; the
    discrete-event limit for the same loads: dotted with crosses; the policy's long-run
    limit: thin and faint. A dotted vertical line marks each mode's measured knee (TTFT
    above 2 x idle)."""
    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    (p50_ax, p90_ax), (itl_ax, tok_ax) = axes
    panels = (
        (p50_ax, "ttft_p50_ms", "TTFT p50 ms (log)", "p50"),
        (p90_ax, "ttft_p90_ms", "TTFT p90 ms (log)", "p90"),
        (itl_ax, "itl_p50_ms", "ITL p50 ms", None),
        (tok_ax, "output_tokens_per_s", "output tokens/s", None),
    )
    others = iter(["tab:green", "tab:purple", "tab:orange", "tab:brown"])
    for mode, points in curves.items():
        color = MODE_COLORS.get(mode) or next(others)
        series = (
            (points, "o-", {}, f"{mode}"),
            ((limits or {}).get(mode, ()), "x:", {"alpha": 0.7, "linewidth": 1}, f"{mode} limit, same loads"),
            ((long_run or {}).get(mode, ()), "-", {"alpha": 0.3, "linewidth": 2}, f"{mode} limit, long run"),
        )
        for pts, style, kw, label in series:
            pts = sorted(pts, key=lambda p: p.fraction)
            if not pts:
                continue
            x = [p.fraction * 100 for p in pts]
            for ax, attr, _, _ in panels:
                if attr == "output_tokens_per_s" and style == "-":
                    continue  # a long run's tok/s is just the offered load
                ax.plot(x, [getattr(p, attr) for p in pts], style, color=color, label=label, **kw)
        for ax, _, _, which in panels:
            at = (knees or {}).get(mode, {}).get(which) if which else None
            if at is not None:
                ax.axvline(at * 100, color=color, linestyle=":", linewidth=1)
                where = ax.get_xaxis_transform()  # x in data, y in axes fraction
                ax.text(at * 100, 0.55, f" {mode} knee {at:.0%}", transform=where, color=color, fontsize=8, rotation=90)
    for ax, _, ylabel, which in panels:
        if which:
            ax.set_yscale("log")
        ax.set_ylabel(ylabel)
        ax.set_xlabel(f"offered load, % of capacity ({capacity:.2f} req/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    p50_ax.set_title("time to first token, median")
    p90_ax.set_title("time to first token, 90th percentile")
    itl_ax.set_title("inter-token latency, median")
    tok_ax.set_title("throughput")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
