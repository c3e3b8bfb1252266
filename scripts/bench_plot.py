"""The benchmark PNG: TTFT and ITL against offered load, and throughput against offered load."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from bench_stats import LoadSummary


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
