"""`make bench`: both scheduler modes served, the policy limits, the ratios, one sweep.

sim (default): the server runs the `sim` backend (a compiled Inferentia model timed by the
profile). The suite starts torchserve once per mode with a generated model-config:
  continuous  continuousBatching: true, batchSize 2 x n_slots, maxBatchDelay 1,
              scheduler {mode: continuous, n_slots, prefill_token_budget, overlap}
  static      batchSize = micro_batch_size = n_slots, maxBatchDelay 20 ms, scheduler.mode static
and sends each the same loads: one stream (synchronous), B = n_slots concurrent streams,
then Poisson loads at fractions of capacity (the sweep). Capacity (req/s) is the same for
both modes: the discrete-event `continuous` policy's saturated throughput for the
workload's lengths (scripts/bench/des.py). Every load is also simulated by bench_des for
the mode's policy, same arrival times, zero overhead: the `limit` columns.
Ratios (continuous mode unless said):
  P1 = served ITL p50, one stream / profile decode step at batch 1              (goal <= 1.05)
  P2 = served output tok/s, B streams / DES continuous tok/s, same load          (goal >= 0.95)
  P3 = TTFT p50 at 70% of capacity / TTFT p50 idle (one stream)                  (goal <= 1.5)
  P4 = TTFT p50 at 50% of capacity, static / continuous                          (goal >= 10)
  P2s = P2 with every request sampled (top-p 0.9, temperature 0.8)               (goal >= 0.95)
        beside it, the same load on a server whose sim runs the old per-slot sampler
  P8  = host sampling time per step / the profile's decode step (scripts/bench/sampling.py):
        (a) 8 x 32,000, (b) 32 x 128,256 (a neuronx or nxdi step), every row top-p 0.9 T 0.8 (goal <= 0.10; greedy
        <= 0.02), with the per-slot sampler's figure beside it
  P7  = served output tok/s with R = 3 replicas at 3 x B streams / (3 x served tok/s with one
        replica at B streams), B = 32, the Llama-3.1-8B TP8 profile, the seed's 1500 / 250
        token requests (goal >= 0.95); two more servers (scripts/bench/replicas.py), which also
        give the seed workload's throughput sweep on the 3 x TP8 layout beside the published
        TGI / vLLM figures (`--no-replicas` skips the stage)
  P9  = constrained-decoding host time per step / the TP8 profile's decode step at 8 rows
        (scripts/bench/constrained.py, in its own process before any server starts, about 15 s):
        8 slots, each a GrammarMasks matcher for a 10-field JSON Schema, over [8, 128,256] logits,
        mask + advance per step (goal <= 0.05); beside it, BatchSampler.sample with and without
        the constraint (`--no-constrained` skips the stage)
hf: the model of --model-dir (`make bench BACKEND=hf`: the default model, SmolLM2-135M-Instruct,
float32) on CPU with `cpu_threads: 1`, continuous mode, 4 slots; prompts of real text (100±10
tokens, scripts/bench/client.py's PromptMaker), 64 output tokens each, EOS ignored. Served at one
stream (10 requests) and at B = 4 streams (5 rounds); scripts/bench/backend.py (its CLI) measures
the backend's own step loop in-process at batch 1 and at batch 4, best of two runs before and two
after the served loads:
  P5-single = served output tok/s, one stream / in-process tok/s at batch 1    (goal >= 0.90)
  P5        = served output tok/s, B streams / in-process tok/s at batch B      (goal >= 0.90)
beside them the idle TTFT (p50, one stream) and the TorchServe worker's RSS (scripts/bench/memory.py's
worker_rss_mib, sampled every 0.5 s over the loads: the peak and after the loads); measured
figures in docs/performance.md.
Each ratio is printed last, on its own line, with its goal and its figures: `P2 0.96 ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from handler.backends.sim_profile import Profile, load_profile
from scripts.bench import des
from scripts.bench import replicas as bench_replicas
from scripts.bench import sampling as bench_sampling
from scripts.bench import server as bench_server
from scripts.bench.backend import summarize_measured
from scripts.bench.client import Lengths, Load, PromptMaker, Target, Workload, run_all
from scripts.bench.memory import worker_rss_mib
from scripts.bench.stats import LoadSummary, SweepPoint, format_table, knee, sweep_points

REPO = Path(__file__).resolve().parents[2]
DEFAULT_PROFILE = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
HF_BATCH = 4
HF_SYNC_REQUESTS = 10  # the sim's defaults (20 requests, 10 rounds) would take minutes per load on CPU
HF_CONCURRENT_ROUNDS = 5
HF_OUTPUT_TOKENS = 64
HF_REFERENCE_REPEATS = 2  # per in-process run; one run before and one after the served loads
RSS_EVERY_S = 0.5
MODES = ("continuous", "static")
DEFAULT_SWEEP = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
LONG_SWEEP = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95)
METRIC_NAMES = (
    "llm_time_to_first_token_seconds",
    "llm_inter_token_latency_seconds",
    "llm_queue_wait_seconds",
    "llm_prefill_step_seconds",
    "llm_decode_step_seconds",
    "llm_frontend_round_trip_seconds",  # the per-step frontend round trip that overlap hides
    "llm_step_sampling_seconds",  # the host's share of a step, by stage: choosing tokens
    "llm_step_detokenize_seconds",  # ... and detokenizing / stop strings
)
# The per-step figures printed beside P7: a step's length and the host's share of it, and the round trip
STEP_METRICS = (
    "llm_decode_step_seconds",
    "llm_prefill_step_seconds",
    "llm_step_sampling_seconds",
    "llm_step_detokenize_seconds",
    "llm_frontend_round_trip_seconds",
)
SAMPLED = {"temperature": 0.8, "top_p": 0.9}  # P2s's requests
GOALS: dict[str, tuple[str, float]] = {
    "P1": ("<=", 1.05),
    "P2": (">=", 0.95),
    "P3": ("<=", 1.5),
    "P4": (">=", 10.0),
    "P5-single": (">=", 0.90),
    "P5": (">=", 0.90),
    "P2s": (">=", 0.95),
    "P8a": ("<=", 0.10),
    "P8b": ("<=", 0.10),
    "P8a-greedy": ("<=", 0.02),
    "P8b-greedy": ("<=", 0.02),
    "P7": (">=", 0.95),
    "P9": ("<=", 0.05),
}


# -- model configs -----------------------------------------------------------------------
def with_scheduler(
    config: dict[str, Any],
    mode: str,
    n_slots: int,
    prefill_token_budget: int = des.DEFAULT_BUDGET,
    overlap: bool = True,
    max_batch_delay_ms: float = 20,
    in_flight: int | None = None,
    admission_wait: float | None = None,
) -> dict[str, Any]:
    """`config` set up for one scheduler mode.

    continuous: batchSize is the requests TorchServe keeps in the worker (slots + the
    engine's waiting FIFO). 2 x n_slots lets the engine refill every slot at the very next
    step even when all of them end together (a fixed-length batch does), without waiting a
    round trip to the frontend; more would only hold requests in one worker that the
    frontend queue holds just as well (FIFO either way). maxBatchDelay 1 ms: with requests
    in flight the frontend never waits, and a lone request should not wait for company (0
    would be TorchServe's 100 ms default, see handler/config.py _check_batch_delay).
    static: today's TorchServe batching, batchSize = micro_batch_size = n_slots."""
    out = copy.deepcopy(config)
    micro = out.setdefault("micro_batching", {})
    micro["micro_batch_size"] = n_slots  # continuous ignores it; bench_backend reads it for the batch
    micro.setdefault("parallelism", {"preprocess": 2, "inference": 1, "postprocess": 2})
    if mode == "continuous":
        out["continuousBatching"] = True
        out["batchSize"] = in_flight or 2 * n_slots
        out["maxBatchDelay"] = 1
        out["scheduler"] = {
            "mode": "continuous",
            "n_slots": n_slots,
            "prefill_token_budget": prefill_token_budget,
            "overlap": overlap,
        }
        if admission_wait is not None:  # else the handler's default
            out["scheduler"]["admission_wait"] = admission_wait
    elif mode == "static":
        out.pop("continuousBatching", None)
        out["batchSize"] = n_slots
        out["maxBatchDelay"] = max_batch_delay_ms
        out["scheduler"] = {"mode": "static", "n_slots": n_slots}
    else:
        raise ValueError(f"unknown scheduler mode {mode!r}")
    return out


def sim_model_config(profile: Path, time_scale: float) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "configs" / "model-config-sim.yaml").read_text())
    config["handler"]["sim"]["profile"] = str(profile.resolve())
    config["handler"]["sim"]["time_scale"] = time_scale
    return config


def hf_model_config(batch: int) -> dict[str, Any]:
    base = {
        "minWorkers": 1,
        "maxWorkers": 1,
        "responseTimeout": 120,
        "handler": {
            "model_checkpoint_dir": "model",
            "backend": "hf",
            "cpu_threads": 1,  # one core for the model, one for the frontend, engine and client; same in-process
            "n_positions": 1024,
            "default_max_new_tokens": 64,
            "max_new_tokens": 512,
        },
    }
    return with_scheduler(base, "continuous", batch)


def model_name(model_dir: Path) -> str:
    """The model's name: SOURCE.json's `model` (what `make model` wrote), else the folder's name."""
    try:
        return str(json.loads((model_dir / "SOURCE.json").read_text())["model"])
    except (OSError, ValueError, KeyError):
        return model_dir.name


def backend_reference(
    config: dict[str, Any], model_dir: Path, workdir: Path, prompt_tokens: int, output_tokens: int, repeats: int
) -> dict[str, Any]:
    """scripts/bench/backend.py's CLI in its own process; its JSON (batch_size, step_1_ms,
    generate_tokens_per_s: the backend's own loop at the batch size, in-process)."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "reference-config.yaml"
    config = config | {"handler": {**config["handler"], "model_checkpoint_dir": str(model_dir)}}
    path.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "scripts.bench.backend", "--config", str(path)]
    cmd += ["--model-dir", str(model_dir), "--prompt-tokens", str(prompt_tokens)]
    cmd += ["--output-tokens", str(output_tokens), "--repeats", str(repeats)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_backend.py failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return parse_json_output(proc.stdout)


def parse_json_output(stdout: str) -> dict[str, Any]:
    """The JSON object a script printed, skipping any lines before it."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("{"):
            return json.loads("\n".join(lines[i:]))
    raise ValueError(f"no JSON object in the output: {stdout[-500:]!r}")


# -- loads -------------------------------------------------------------------------------
@dataclass
class Plan:
    """What each mode is sent: the loads, and each open load's fraction of capacity."""

    loads: list[Load]
    fractions: dict[str, float]  # load name -> offered / capacity


def plan_loads(
    capacity: float | None,
    streams: int,
    sync_requests: int,
    concurrent_rounds: int,
    sweep: Sequence[float] = DEFAULT_SWEEP,
    ratio_fractions: Sequence[float] = (0.5, 0.7),
    ratio_requests: int = 100,
    sweep_seconds: float = 15.0,
    sweep_min_requests: int = 12,
) -> Plan:
    """Synchronous, concurrent at `streams`, then (with a capacity) one Poisson load per
    fraction, lowest first: max(sweep_min_requests, rate x sweep_seconds) requests, and at
    least `ratio_requests` at the fractions a ratio reads (P3, P4)."""
    loads = [Load("synchronous", sync_requests), Load("concurrent", streams * concurrent_rounds, streams)]
    fractions: dict[str, float] = {}
    if capacity:
        for f in sorted({*sweep, *ratio_fractions}):
            rate = f * capacity
            n = max(sweep_min_requests, round(rate * sweep_seconds))
            if any(math.isclose(f, r) for r in ratio_fractions):
                n = max(n, ratio_requests)
            load = Load("poisson", n, rate=rate, label=f"poisson {f:.0%} {rate:.2f}/s")
            loads.append(load)
            fractions[load.name] = f
    return Plan(loads, fractions)


@dataclass
class ModeRun:
    """One mode's served loads and, for sim, the same loads simulated (its policy limit)."""

    mode: str
    config: dict[str, Any]
    served: list[LoadSummary]
    limits: list[LoadSummary | None]
    fractions: dict[str, float]
    handler_metrics: dict[str, float] = field(default_factory=dict)
    # P2s: the concurrent load again, every request sampled; with the batched sampler (this
    # server) and with the old per-slot one (a server of its own)
    sampled: LoadSummary | None = None
    sampled_per_slot: LoadSummary | None = None
    sampled_metrics: dict[str, float] = field(default_factory=dict)
    worker_rss_mib: dict[str, float] = field(default_factory=dict)  # hf: {"peak": ..., "after_loads": ...}

    def kind(self, kind: str) -> tuple[LoadSummary, LoadSummary | None] | None:
        for s, lim in zip(self.served, self.limits, strict=True):
            if s.kind == kind:
                return s, lim
        return None

    def at(self, fraction: float) -> tuple[LoadSummary, LoadSummary | None] | None:
        for s, lim in zip(self.served, self.limits, strict=True):
            if s.name in self.fractions and math.isclose(self.fractions[s.name], fraction):
                return s, lim
        return None

    def to_dict(self, capacity: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "config": self.config,
            "fractions": self.fractions,
            "handler_metrics_mean_s": self.handler_metrics,
            "loads": [s.to_dict() for s in self.served],
            "limits": [lim.to_dict() if lim else None for lim in self.limits],
            "sampled": self.sampled.to_dict() if self.sampled else None,
            "sampled_per_slot": self.sampled_per_slot.to_dict() if self.sampled_per_slot else None,
            "sampled_handler_metrics_mean_s": self.sampled_metrics,
            "worker_rss_mib": self.worker_rss_mib,
        }
        if capacity:
            out["sweep"] = [asdict(p) for p in sweep_points(self.served, capacity)]
            out["sweep_limit"] = [asdict(p) for p in sweep_points([x for x in self.limits if x], capacity)]
        return out


def des_limits(
    profile: Profile, policy: des.Policy, loads: Sequence[Load], shape: des.Shape, seed: int
) -> list[LoadSummary]:
    """Each load simulated under `policy`: same kinds, counts and (open loads) arrival times."""
    return [
        des.run(profile, policy, des.Load(x.kind, x.requests, x.streams, x.rate, arrival_seed=seed + 2), shape, x.name)
        for x in loads
    ]


# -- the ratios --------------------------------------------------------------------------
@dataclass(frozen=True)
class Ratio:
    name: str
    value: float
    numerator: str  # the measured figure, with its unit and where it comes from
    denominator: str
    limit: float | None = None  # the same ratio in the discrete-event limit (zero overhead)
    baseline: float | None = None  # the same ratio with the old per-slot sampler (P2s, P8)
    goal_at: tuple[str, float] | None = None  # (op, target) where the name is not in GOALS (P1-asgi, P14)

    @property
    def goal(self) -> str:
        op, target = self.goal_at or GOALS[self.name]
        return f"{op} {target:g}"

    @property
    def met(self) -> bool:
        op, target = self.goal_at or GOALS[self.name]
        return self.value <= target if op == "<=" else self.value >= target

    def line(self) -> str:
        text = f"{self.name} {self.value:.2f}  goal {self.goal} {'met' if self.met else 'NOT met'}"
        text += f"  = {self.numerator} / {self.denominator}"
        if self.limit is not None:
            text += f"  (policy limit: {self.limit:.2f})"
        if self.baseline is not None:
            text += f"  (per-slot sampler: {self.baseline:.3g})"
        return text

    def to_dict(self) -> dict[str, Any]:
        fields = {k: v for k, v in asdict(self).items() if k != "goal_at"}  # "goal" says it
        return {**fields, "goal": self.goal, "met": self.met}


def p1(sync: LoadSummary, step_1_ms: float) -> Ratio:
    return Ratio(
        "P1",
        sync.itl_ms.p50 / step_1_ms,
        f"served ITL p50 {sync.itl_ms.p50:.2f} ms (one stream)",
        f"profile decode step(1) {step_1_ms:.2f} ms",
        limit=1.0,
    )


def p2(concurrent: LoadSummary, limit: LoadSummary) -> Ratio:
    return Ratio(
        "P2",
        concurrent.output_tokens_per_s / limit.output_tokens_per_s,
        f"served {concurrent.output_tokens_per_s:.1f} tok/s ({concurrent.streams} streams)",
        f"DES {limit.output_tokens_per_s:.1f} tok/s (same load)",
        limit=1.0,
    )


def p3(
    loaded: LoadSummary, idle: LoadSummary, fraction: float, limits: tuple[LoadSummary, LoadSummary] | None
) -> Ratio:
    return Ratio(
        "P3",
        loaded.ttft_ms.p50 / idle.ttft_ms.p50,
        f"TTFT p50 {loaded.ttft_ms.p50:.1f} ms at {fraction:.0%} of capacity ({loaded.offered_rate:.2f} req/s)",
        f"idle TTFT p50 {idle.ttft_ms.p50:.1f} ms (one stream)",
        limit=limits[0].ttft_ms.p50 / limits[1].ttft_ms.p50 if limits else None,
    )


def p4(
    static: LoadSummary, continuous: LoadSummary, fraction: float, limits: tuple[LoadSummary, LoadSummary] | None
) -> Ratio:
    return Ratio(
        "P4",
        static.ttft_ms.p50 / continuous.ttft_ms.p50,
        f"static TTFT p50 {static.ttft_ms.p50:.1f} ms",
        f"continuous TTFT p50 {continuous.ttft_ms.p50:.1f} ms, both at {fraction:.0%} of capacity "
        f"({continuous.offered_rate:.2f} req/s)",
        limit=limits[0].ttft_ms.p50 / limits[1].ttft_ms.p50 if limits else None,
    )


def p5(served: LoadSummary, in_process_tokens_per_s: float, name: str = "P5") -> Ratio:
    """Served output tok/s over the in-process step loop's at the same batch (the load's streams)."""
    streams = f"{served.streams} stream" + ("s" if served.streams != 1 else "")
    return Ratio(
        name,
        served.output_tokens_per_s / in_process_tokens_per_s,
        f"served {served.output_tokens_per_s:.1f} tok/s ({streams})",
        f"in-process {in_process_tokens_per_s:.1f} tok/s (batch {served.streams})",
    )


def hf_ratios(cont: ModeRun | None, in_process_tokens_per_s: dict[int, float] | None) -> list[Ratio]:
    """P5-single (the one-stream load) and P5 (the concurrent load), each against the in-process
    step loop at its batch; a ratio whose batch was not measured in-process is left out."""
    if cont is None or not in_process_tokens_per_s:
        return []
    out = []
    for kind, name in (("synchronous", "P5-single"), ("concurrent", "P5")):
        load = cont.kind(kind)
        if load and (reference := in_process_tokens_per_s.get(load[0].streams)):
            out.append(p5(load[0], reference, name))
    return out


def p2s(sampled: LoadSummary, limit: LoadSummary, per_slot: LoadSummary | None) -> Ratio:
    return Ratio(
        "P2s",
        sampled.output_tokens_per_s / limit.output_tokens_per_s,
        f"served {sampled.output_tokens_per_s:.1f} tok/s ({sampled.streams} streams, every request top-p 0.9 T 0.8)",
        f"DES {limit.output_tokens_per_s:.1f} tok/s (same load)",
        limit=1.0,
        baseline=per_slot.output_tokens_per_s / limit.output_tokens_per_s if per_slot else None,
    )


def p8(timings: list[bench_sampling.Timing]) -> list[Ratio]:
    """P8 (a, b), sampled and greedy, from scripts/bench/sampling.py's timings (stand-in logits)."""
    out = []
    for case in bench_sampling.cases():
        for params, suffix in (("top-p 0.9, T 0.8", ""), ("greedy", "-greedy")):
            t = bench_sampling.find(timings, case.name, params, "batched")
            slow = bench_sampling.find(timings, case.name, params, "per-slot")
            out.append(
                Ratio(
                    f"P8{case.name}{suffix}",
                    t.ratio,
                    f"host sampling {t.ms:.2f} ms per step ({case.rows} rows x {case.vocab:,}, {params})",
                    f"device step {case.step_ms:.1f} ms ({case.step_source})",
                    baseline=slow.ratio,
                )
            )
    return out


def p7(stage: bench_replicas.Stage) -> Ratio:
    many, one, _, _ = stage.p7_loads
    r = stage.plan.replicas
    return Ratio(
        "P7",
        stage.p7,
        f"served {many.output_tokens_per_s:.1f} tok/s ({r} replicas, {many.streams} streams)",
        f"{r} x {one.output_tokens_per_s:.1f} tok/s (1 replica, {one.streams} streams)",
        limit=stage.p7_limit,
    )


@dataclass(frozen=True)
class Constrained:
    """P9's measurement: scripts/bench/constrained.py's figures (its --json) and its printed report."""

    figures: dict[str, Any]
    report: str


def run_constrained(workdir: Path, args: Sequence[str] = ()) -> Constrained | None:
    """scripts/bench/constrained.py (with `args`) in its own process: its torch thread setting
    and the 128k tokenizer's memory stay out of the suite. None, with the reason on stderr, when
    it fails: the other figures stand without P9."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "constrained.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "scripts.bench.constrained", *args, "--json", str(path)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    except subprocess.TimeoutExpired:
        print("[bench] P9: bench_constrained.py ran past 600 s; no P9", file=sys.stderr)
        return None
    if proc.returncode != 0 or not path.is_file():
        print(
            f"[bench] P9: bench_constrained.py failed ({proc.returncode}); no P9:\n{proc.stderr[-3000:]}",
            file=sys.stderr,
        )
        return None
    return Constrained(json.loads(path.read_text()), proc.stdout.strip())


def p9(c: Constrained) -> Ratio:
    f = c.figures
    vocab = f"{f['vocab_size']:,} ({f['vocab']}{', SYNTHETIC' if f['synthetic'] else ''})"
    return Ratio(
        "P9",
        f["p9"],
        f"constrained decoding {f['step_ms']:.3f} ms per step (mask {f['mask_ms']:.3f} + advance "
        f"{f['advance_ms']:.3f}; {f['rows']} rows x {vocab}, schema-10)",
        f"TP8 decode step({f['rows']}) {f['decode_step_ms']:.2f} ms",
    )


def p7_host_metrics(stage: bench_replicas.Stage) -> dict[str, dict[str, float]]:
    """The handler metrics' means over each of P7's two loads ("single": 1 replica, "replicas"):
    the per-step host time that shows where a low P7 goes."""
    out = {}
    for key, name in (("single", stage.plan.p7_names[1]), ("replicas", stage.plan.p7_names[0])):
        before, after = stage.runs[key].scrapes_around(name)
        out[key] = handler_metrics(after, histogram_totals(before)) if after else {}
    return out


def mode_ratios(run: ModeRun, step_1_ms: float, p3_fraction: float) -> list[Ratio]:
    """P1, P2, P3 of one mode, each against that mode's own policy limit."""
    out = []
    sync, conc, loaded = run.kind("synchronous"), run.kind("concurrent"), run.at(p3_fraction)
    if sync:
        out.append(p1(sync[0], step_1_ms))
    if conc and conc[1]:
        out.append(p2(conc[0], conc[1]))
    if sync and loaded:
        limits = (loaded[1], sync[1]) if loaded[1] and sync[1] else None
        out.append(p3(loaded[0], sync[0], p3_fraction, limits))
    return out


def compute_ratios(
    backend: str,
    runs: dict[str, ModeRun],
    step_1_ms: float | None = None,
    p3_fraction: float = 0.7,
    p4_fraction: float = 0.5,
    in_process_tokens_per_s: dict[int, float] | None = None,
    sampling_timings: list[bench_sampling.Timing] | None = None,
) -> list[Ratio]:
    """sim: P1-P3 of the continuous mode, P4 when both modes ran, P2s and P8; hf: P5-single and
    P5 (`in_process_tokens_per_s`: the step loop's tok/s by batch size)."""
    ratios: list[Ratio] = []
    cont = runs.get("continuous")
    if backend != "sim":
        return hf_ratios(cont, in_process_tokens_per_s)
    if cont and step_1_ms:
        ratios += mode_ratios(cont, step_1_ms, p3_fraction)
    static = runs.get("static")
    if cont and static and (s := static.at(p4_fraction)) and (c := cont.at(p4_fraction)):
        ratios.append(p4(s[0], c[0], p4_fraction, (s[1], c[1]) if s[1] and c[1] else None))
    if cont and cont.sampled and (conc := cont.kind("concurrent")) and conc[1]:
        ratios.append(p2s(cont.sampled, conc[1], cont.sampled_per_slot))
    if sampling_timings:
        ratios += p8(sampling_timings)
    return ratios


def histogram_totals(text: str) -> dict[str, tuple[float, float]]:
    """(sum, count) of each of our histograms from a Prometheus scrape."""
    totals: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        for name in METRIC_NAMES:
            total, count = totals.get(name, (0.0, 0.0))
            if line.startswith(name + "_sum"):
                totals[name] = (total + float(line.rsplit(" ", 1)[1]), count)
            elif line.startswith(name + "_count"):
                totals[name] = (total, count + float(line.rsplit(" ", 1)[1]))
    return totals


def handler_metrics(text: str, before: dict[str, tuple[float, float]] | None = None) -> dict[str, float]:
    """Mean of each of our histograms from a Prometheus scrape (sum / count); with `before`
    (an earlier scrape's totals), the mean of what was recorded since."""
    out = {}
    for name, (total, count) in histogram_totals(text).items():
        earlier_total, earlier_count = (before or {}).get(name, (0.0, 0.0))
        if count > earlier_count:
            out[name] = (total - earlier_total) / (count - earlier_count)
    return out


# -- the worker's memory (hf) ------------------------------------------------------------
class WorkerRss:
    """The TorchServe worker's RSS (scripts/bench/memory.py's worker_rss_mib: the worker
    processes and their children), sampled on a thread every `every_s` while in the `with`
    block, once more at its end: `peak` and `last` (MiB; 0 when nothing could be read)."""

    def __init__(self, server: Any, every_s: float = RSS_EVERY_S) -> None:
        self.server, self.every_s = server, every_s
        self.peak = self.last = 0.0
        self._failed = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_until_stopped, name="worker-rss", daemon=True)

    def sample(self) -> float:
        if self._failed:
            return self.last
        try:
            self.last = worker_rss_mib(self.server)
        except Exception as exc:  # a stand-in server, or the worker already gone: the figures stand without it
            print(f"[bench] could not read the worker's RSS: {exc}", file=sys.stderr)
            self._failed = True
            self._stop.set()
            return self.last
        self.peak = max(self.peak, self.last)
        return self.last

    def _sample_until_stopped(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.every_s)

    def __enter__(self) -> WorkerRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def figures(self) -> dict[str, float]:
        return {"peak": round(self.peak, 1), "after_loads": round(self.last, 1)}


# -- results -----------------------------------------------------------------------------
def write_suite_results(
    out: Path,
    meta: dict[str, Any],
    runs: dict[str, ModeRun],
    capacity: float | None,
    title: str,
    long_run: dict[str, list[SweepPoint]] | None = None,
    replicas: dict[str, Any] | None = None,
) -> tuple[Path, Path | None]:
    """`<out>.json` (every figure and request; with `replicas`, the replicas stage's) and, with
    a capacity and open loads, `<out>.png`: the sweep, one curve per mode with its limits."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    modes = {mode: run.to_dict(capacity) for mode, run in runs.items()}
    path.write_text(json.dumps({"meta": meta, "modes": modes, "replicas": replicas}, indent=1))
    png = None
    if capacity:
        curves = {mode: sweep_points(run.served, capacity) for mode, run in runs.items()}
        if any(curves.values()):
            from scripts.bench.plot import plot_sweep

            limits = {mode: sweep_points([x for x in run.limits if x], capacity) for mode, run in runs.items()}
            knees_served = meta.get("knees", {}).get("served")
            png = plot_sweep(curves, out.with_suffix(".png"), capacity, title, limits, long_run, knees_served)
    return path, png


def long_run_points(ref: des.Reference, capacity: float, modes: Sequence[str]) -> dict[str, list[SweepPoint]]:
    """The long-run policy table as sweep points, per mode (its policy)."""
    return {m: sweep_points([by[m] for by in ref.loaded.values() if m in by], capacity) for m in modes}


def knees(
    runs: dict[str, ModeRun], capacity: float, long_run: dict[str, list[SweepPoint]] | None = None
) -> dict[str, dict[str, dict[str, float | None]]]:
    """Per mode, the lowest swept load whose TTFT p50 (p90) passes 2 x the idle TTFT p50:
    served, the limit for the same loads, and the policy's long-run limit."""
    out: dict[str, dict[str, dict[str, float | None]]] = {"served": {}, "limit": {}, "long_run": {}}
    for mode, run in runs.items():
        sync = run.kind("synchronous")
        if not sync:
            continue

        def both(points: list[SweepPoint], idle_ms: float) -> dict[str, float | None]:
            return {"p50": knee(points, idle_ms), "p90": knee(points, idle_ms, tail=True)}

        out["served"][mode] = both(sweep_points(run.served, capacity), sync[0].ttft_ms.p50)
        if sync[1]:
            idle_limit = sync[1].ttft_ms.p50
            out["limit"][mode] = both(sweep_points([x for x in run.limits if x], capacity), idle_limit)
            if long_run and long_run.get(mode):
                out["long_run"][mode] = both(long_run[mode], idle_limit)
    return out


def _pct(value: float | None) -> str:
    return "none" if value is None else f"{value:.0%}"


def _knee_rows(knee_at: dict[str, dict[str, dict[str, float | None]]], mode: str) -> list[tuple[str, dict]]:
    names = {"served": "served", "limit": "limit (same loads)", "long_run": "limit (long run)"}
    return [(names[k], knee_at[k][mode]) for k in names if mode in knee_at.get(k, {})]


# -- P2s: the concurrent load, sampled -----------------------------------------------------
def sampled_load(streams: int, rounds: int, sampler: str = "batched") -> Load:
    return Load("concurrent", streams * rounds, streams, label=f"sampled@{streams} {sampler}")


def fresh_workload(model_dir: Path, args: argparse.Namespace, output_tokens: int) -> Workload:
    """The same prompts, lengths and arrival times for every server."""
    return Workload(
        PromptMaker(model_dir, seed=0),
        Lengths(args.prompt_tokens, args.prompt_spread),
        Lengths(output_tokens, 0),
        seed=0,
        progress=not args.no_progress,
    )


def run_sampled(server: Any, load: Load, workload: Workload) -> tuple[LoadSummary, dict[str, float]]:
    """The sampled load on a running server; the handler metrics' means over just that load."""
    before = histogram_totals(server.scrape_metrics())
    target = Target(server.url, server.model_name, "native", server.headers, sampling=SAMPLED)
    [summary] = asyncio.run(run_all(target, [load], workload, sweep_streams=load.streams))
    return summary, handler_metrics(server.scrape_metrics(), before)


def run_sampled_per_slot(
    workdir: Path, model_dir: Path, config: dict[str, Any], load: Load, workload: Workload
) -> LoadSummary:
    """The same sampled load on a server whose sim runs the old per-slot sampler (P2s's baseline): the
    same config, in an archive whose entry point is scripts/bench/per_slot_sampler.py."""
    print(f"[bench] continuous, per-slot sampler: starting torchserve in {workdir} ...", file=sys.stderr)
    server = bench_server.start(workdir, model_dir, config, handler=REPO / "scripts" / "bench" / "per_slot_sampler.py")
    try:
        target = Target(server.url, server.model_name, "native", server.headers, sampling=SAMPLED)
        [summary] = asyncio.run(run_all(target, [load], workload, sweep_streams=load.streams))
    finally:
        server.stop()
    return summary


# -- main: the stages --------------------------------------------------------------------
@dataclass
class Setup:
    """What every stage reads: the arguments and what follows from them."""

    args: argparse.Namespace
    sim: bool
    modes: list[str]
    output_tokens: int
    sweep: Sequence[float]
    scale: int  # 4 with --long
    shape: des.Shape
    workroot: Path
    model_dir: Path
    n_slots: int
    streams: int
    plan: Plan
    configs: dict[str, dict[str, Any]]
    title: str
    profile: Profile | None = None
    capacity: float | None = None
    ref: dict[str, Any] = field(default_factory=dict)  # the sim profile's figures, or hf's in-process run
    replicas: bench_replicas.Settings | None = None  # sim with --replicas: P7's stage


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "hf"), default="sim")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument(
        "--model-dir",
        type=Path,
        default=REPO / "models" / "tiny-llama",
        help="sim: the tokenizer; hf: the model served (make bench BACKEND=hf: models/smollm2-135m-instruct)",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--out", type=Path, help="result file stem (default bench_results/bench-<backend>)")
    parser.add_argument(
        "--modes",
        help="comma-separated: continuous,static (sim default) or continuous (hf); none: no mode (sim: P8 and P7 only)",
    )
    parser.add_argument("--sync-requests", type=int, help=f"default: 20 (sim), {HF_SYNC_REQUESTS} (hf)")
    parser.add_argument("--streams", type=int, help="concurrent streams for P2/P5 (default: n_slots)")
    parser.add_argument(
        "--concurrent-rounds", type=int, help=f"requests per stream (default: 10 (sim), {HF_CONCURRENT_ROUNDS} (hf))"
    )
    parser.add_argument(
        "--sweep", type=des.parse_fractions, help=f"Poisson loads, fractions of capacity (default {DEFAULT_SWEEP})"
    )
    parser.add_argument("--sweep-seconds", type=float, default=15.0, help="a sweep load's requests: rate x this")
    parser.add_argument("--sweep-min-requests", type=int, default=12)
    parser.add_argument("--poisson-requests", type=int, default=100, help="at least this many at P3's and P4's loads")
    parser.add_argument("--long", action="store_true", help=f"sweep {LONG_SWEEP}, 4x the requests (about 40 min)")
    parser.add_argument("--load-fraction", type=float, default=0.7, help="P3's load, of capacity")
    parser.add_argument("--p4-fraction", type=float, default=0.5, help="P4's load, of capacity")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--prompt-spread", type=int, default=10)
    parser.add_argument("--output-tokens", type=int, help=f"default: 128 (sim), {HF_OUTPUT_TOKENS} (hf)")
    parser.add_argument("--prefill-token-budget", type=int, default=des.DEFAULT_BUDGET)
    parser.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=True, help="scheduler.overlap")
    parser.add_argument(
        "--admission-wait", type=float, default=None, help="scheduler.admission_wait (default: the handler's)"
    )
    parser.add_argument("--max-batch-delay-ms", type=float, default=20, help="static mode's maxBatchDelay")
    parser.add_argument("--in-flight", type=int, help="continuous mode's batchSize (default 2 x n_slots)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim: scales every simulated sleep (> 0)")
    parser.add_argument("--des-requests", type=int, default=5000, help="per load of the long-run policy table")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument(
        "--sampled", action=argparse.BooleanOptionalAction, default=True, help="sim: P2s (two more sampled loads)"
    )
    parser.add_argument(
        "--constrained",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="sim: P9, constrained decoding per step (scripts/bench/constrained.py, about 15 s)",
    )
    replicas = parser.add_argument_group(
        "the replicas stage (sim): P7 and the seed workload, scripts/bench/replicas.py"
    )
    replicas.add_argument(
        "--replicas",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="two more servers: 1 replica at B streams, then the 3 x TP8 layout's sweep (about 4 min)",
    )
    replicas.add_argument(
        "--replica-config", type=Path, default=bench_replicas.SEED_CONFIG, help="the R-replica model-config (sim)"
    )
    replicas.add_argument("--replica-profile", type=Path, default=bench_replicas.SEED_PROFILE)
    replicas.add_argument(
        "--replica-levels",
        type=bench_replicas.parse_levels,
        default=bench_replicas.SEED_LEVELS,
        help="the sweep's concurrent streams, comma-separated (R x B is always one)",
    )
    replicas.add_argument("--replica-rounds", type=int, default=2, help="requests per stream in each load")
    replicas.add_argument("--replica-streams", type=int, help="B (default: the profile's slots)")
    replicas.add_argument("--replica-prompt-tokens", type=int, default=bench_replicas.SEED_PROMPT_TOKENS)
    replicas.add_argument("--replica-prompt-spread", type=int, default=bench_replicas.SEED_PROMPT_SPREAD)
    replicas.add_argument("--replica-output-tokens", type=int, default=bench_replicas.SEED_OUTPUT_TOKENS)
    args = parser.parse_args(argv)
    if args.replica_rounds < 1 or (args.replica_streams is not None and args.replica_streams < 1):
        parser.error("--replica-rounds and --replica-streams must be >= 1")
    if args.time_scale <= 0:
        parser.error("--time-scale must be > 0 (the ratios divide by the profile's scaled times)")
    sim = args.backend == "sim"
    if args.sync_requests is None:
        args.sync_requests = 20 if sim else HF_SYNC_REQUESTS
    if args.concurrent_rounds is None:
        args.concurrent_rounds = 10 if sim else HF_CONCURRENT_ROUNDS
    args.mode_list = [m.strip() for m in (args.modes or ("continuous,static" if sim else "continuous")).split(",")]
    args.mode_list = [m for m in args.mode_list if m and m != "none"]
    if bad := [m for m in args.mode_list if m not in MODES]:
        parser.error(f"unknown mode(s) {bad}: use {', '.join(MODES)}")
    return args


def set_up(args: argparse.Namespace) -> Setup:
    """The model, the profile's limits, the loads and one model-config per mode."""
    sim = args.backend == "sim"
    output_tokens = args.output_tokens or (128 if sim else HF_OUTPUT_TOKENS)
    scale = 4 if args.long else 1
    shape = des.Shape(args.prompt_tokens, output_tokens, args.prompt_spread)
    workroot = args.workdir.resolve() / args.backend
    ref: dict[str, Any] = {}
    profile: Profile | None = None
    capacity: float | None = None
    if sim:
        model_dir, base = args.model_dir.resolve(), sim_model_config(args.profile, args.time_scale)
        profile = des.scaled(load_profile(args.profile), args.time_scale)
        n_slots = profile.batch_size  # the sim's slots are its compiled batch
        capacity = des.capacity(profile, shape, n_slots, args.prefill_token_budget)
        ref = {
            "profile": profile.name,
            "time_scale": args.time_scale,
            "step_1_ms": profile.decode_s(1) * 1000,
            "step_batch_ms": profile.decode_s(n_slots) * 1000,
            "prefill_1_ms": profile.prefill_s(1, args.prompt_tokens) * 1000,
            "ideal_tokens_per_s": profile.ideal_tokens_per_s(),
        }
        title = (
            f"sim {profile.name}: {n_slots} slots, prompts {args.prompt_tokens}±{args.prompt_spread}, "
            f"{output_tokens} output tokens"
        )
    else:
        model_dir, n_slots = args.model_dir.resolve(), HF_BATCH
        base = hf_model_config(n_slots)
        title = (
            f"hf: {model_name(model_dir)} on CPU, {n_slots} slots, prompts {args.prompt_tokens}±{args.prompt_spread}, "
            f"{output_tokens} output tokens"
        )
    streams = args.streams or n_slots
    sweep = args.sweep if args.sweep is not None else (LONG_SWEEP if args.long else DEFAULT_SWEEP)
    plan = plan_loads(
        capacity if sim else None,
        streams,
        args.sync_requests * scale,
        args.concurrent_rounds * scale,
        sweep,
        (args.load_fraction, args.p4_fraction) if sim else (),
        args.poisson_requests * scale,
        args.sweep_seconds * scale,
        args.sweep_min_requests * scale,
    )
    configs = {
        m: with_scheduler(
            base,
            m,
            n_slots,
            args.prefill_token_budget,
            args.overlap,
            args.max_batch_delay_ms,
            args.in_flight,
            args.admission_wait,
        )
        for m in args.mode_list
    }
    for config in configs.values():  # the bench measures waiting, not load shedding: room to queue a whole load
        config["jobQueueSize"] = max(config.get("jobQueueSize", 1), *(x.requests for x in plan.loads))
    replicas = None
    if sim and args.replicas:
        replicas = bench_replicas.Settings(
            model_dir=model_dir,
            workdir=workroot / "replicas",
            config=args.replica_config,
            profile=args.replica_profile,
            levels=args.replica_levels,
            rounds=args.replica_rounds * scale,
            streams=args.replica_streams,
            prompt_tokens=args.replica_prompt_tokens,
            prompt_spread=args.replica_prompt_spread,
            output_tokens=args.replica_output_tokens,
            time_scale=args.time_scale,
            progress=not args.no_progress,
        )
        bench_replicas.plan(replicas)  # a config or profile that cannot work fails now, not after the modes
    if capacity:
        print(
            f"[bench] capacity {capacity:.3f} req/s: the continuous policy's saturated throughput at "
            f"{args.prompt_tokens} prompt / {output_tokens} output tokens (discrete-event, profile times); "
            f"loads: " + ", ".join(x.name for x in plan.loads),
            file=sys.stderr,
        )
    return Setup(
        args=args,
        sim=sim,
        modes=args.mode_list,
        output_tokens=output_tokens,
        sweep=sweep,
        scale=scale,
        shape=shape,
        workroot=workroot,
        model_dir=model_dir,
        n_slots=n_slots,
        streams=streams,
        plan=plan,
        configs=configs,
        title=title,
        profile=profile,
        capacity=capacity,
        ref=ref,
        replicas=replicas,
    )


def in_process_reference(s: Setup) -> dict[str, Any]:
    """hf: the backend's own step loop in-process (scripts/bench/backend.py) at batch 1 and at
    the slot count, best of HF_REFERENCE_REPEATS runs each."""
    config = s.configs[s.modes[0]]
    return backend_reference(
        config, s.model_dir, s.workroot, s.args.prompt_tokens, s.output_tokens, repeats=HF_REFERENCE_REPEATS
    )


def best_in_process(references: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The fastest of the in-process references (before and after the served loads) at each
    batch: the first reference's fields with `measured` (and what follows from it) the fastest
    run at each batch, plus `tokens_per_s_by_batch` ({batch: tok/s}), `step_ms_by_batch` and
    `tokens_per_s_runs` (each reference's {batch: tok/s})."""
    best: dict[int, dict[str, float]] = {}
    runs = []
    for ref in references:
        measured = {int(m["batch"]): m for m in ref["measured"].values()}
        runs.append({batch: m["tokens_per_s"] for batch, m in sorted(measured.items())})
        for batch, m in measured.items():
            if batch not in best or m["tokens_per_s"] > best[batch]["tokens_per_s"]:
                best[batch] = m
    out = dict(references[0])
    out["measured"] = {f"batch_{batch}": m for batch, m in sorted(best.items())}
    out["tokens_per_s_by_batch"] = {batch: m["tokens_per_s"] for batch, m in sorted(best.items())}
    out["step_ms_by_batch"] = {batch: m["step_ms"] for batch, m in sorted(best.items())}
    out["tokens_per_s_runs"] = runs
    return summarize_measured(out)


def run_mode(s: Setup, mode: str) -> ModeRun:
    """One torchserve in `mode`: every load, the metrics, and (sim, continuous) P2s's sampled loads."""
    args, config = s.args, s.configs[mode]
    limits: list[LoadSummary | None] = [None] * len(s.plan.loads)
    if s.profile is not None:
        policy = des.Policy(
            "continuous" if mode == "continuous" else "static",
            s.n_slots,
            prefill_token_budget=args.prefill_token_budget,
            max_batch_delay_s=args.max_batch_delay_ms / 1000,
        )
        limits = list(des_limits(s.profile, policy, s.plan.loads, s.shape, seed=0))
        expected = sum(x.duration_s for x in limits if x)
        print(f"[bench] {mode}: the loads take about {expected:.0f} s at the limit", file=sys.stderr)
    workdir = s.workroot / mode
    print(f"[bench] {mode}: starting torchserve in {workdir} ...", file=sys.stderr)
    server = bench_server.start(workdir, s.model_dir, config)
    sampled = None
    rss: dict[str, float] = {}
    try:
        target = Target(server.url, server.model_name, "native", server.headers)
        workload = fresh_workload(s.model_dir, args, s.output_tokens)
        if s.sim:
            served = asyncio.run(run_all(target, list(s.plan.loads), workload, sweep_streams=s.streams))
        else:
            with WorkerRss(server) as watch:
                served = asyncio.run(run_all(target, list(s.plan.loads), workload, sweep_streams=s.streams))
            rss = watch.figures()
        try:
            metrics = handler_metrics(server.scrape_metrics())
        except Exception as exc:  # the figures stand without the cross-check
            print(f"[bench] could not scrape metrics: {exc}", file=sys.stderr)
            metrics = {}
        if s.sim and mode == "continuous" and args.sampled:
            sampled = run_sampled(server, sampled_load(s.streams, args.concurrent_rounds * s.scale), workload)
    finally:
        server.stop()
    run = ModeRun(mode, config, served, limits, s.plan.fractions, metrics, worker_rss_mib=rss)
    if sampled:
        load = sampled_load(s.streams, args.concurrent_rounds * s.scale, "per-slot")
        run.sampled, run.sampled_metrics = sampled
        run.sampled_per_slot = run_sampled_per_slot(
            s.workroot / "per-slot", s.model_dir, config, load, fresh_workload(s.model_dir, args, s.output_tokens)
        )
    return run


@dataclass
class Analysis:
    ratios: list[Ratio]
    by_mode: dict[str, list[Ratio]]
    policy_ref: des.Reference | None
    long_run: dict[str, list[SweepPoint]] | None
    knee_at: dict[str, Any]
    stage: bench_replicas.Stage | None = None
    p7_metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    constrained: Constrained | None = None  # P9's stage


def analyse(
    s: Setup,
    runs: dict[str, ModeRun],
    sampling_timings: list[bench_sampling.Timing] | None,
    stage: bench_replicas.Stage | None = None,
    constrained: Constrained | None = None,
) -> Analysis:
    """The ratios (P7 before P8, P9 last), each mode against its own policy, the long-run policy
    table and the knees."""
    args = s.args
    ratios = compute_ratios(
        args.backend,
        runs,
        step_1_ms=s.ref.get("step_1_ms") if s.sim else None,
        p3_fraction=args.load_fraction,
        p4_fraction=args.p4_fraction,
        in_process_tokens_per_s=s.ref.get("tokens_per_s_by_batch"),
        sampling_timings=sampling_timings,
    )
    p7_metrics = {}
    if stage is not None:
        at = next((i for i, r in enumerate(ratios) if r.name.startswith("P8")), len(ratios))
        ratios.insert(at, p7(stage))
        p7_metrics = p7_host_metrics(stage)
    if constrained is not None:
        ratios.append(p9(constrained))
    by_mode = {m: mode_ratios(r, s.ref["step_1_ms"], args.load_fraction) for m, r in runs.items()} if s.sim else {}
    policy_ref = None
    if s.profile is not None and args.des_requests > 0:
        policy_ref = des.reference(
            s.profile,
            s.shape,
            s.n_slots,
            args.prefill_token_budget,
            args.max_batch_delay_ms / 1000,
            fractions=sorted({*s.sweep, args.load_fraction, args.p4_fraction}),
            streams=s.streams,
            rounds=args.concurrent_rounds,
            requests=args.des_requests,
        )
    long_run = long_run_points(policy_ref, s.capacity, s.modes) if policy_ref and s.capacity else None
    knee_at = knees(runs, s.capacity, long_run) if s.capacity else {}
    return Analysis(ratios, by_mode, policy_ref, long_run, knee_at, stage, p7_metrics, constrained)


def result_meta(s: Setup, a: Analysis, argv: list[str] | None, started: float) -> dict[str, Any]:
    return {
        "title": s.title,
        "backend": s.args.backend,
        "argv": sys.argv[1:] if argv is None else argv,
        "reference": s.ref,
        "shape": asdict(s.shape),
        "n_slots": s.n_slots,
        "streams": s.streams,
        "capacity_req_per_s": s.capacity,
        "capacity_definition": "the discrete-event continuous policy's saturated throughput (req/s) at the mean "
        "prompt and output lengths, profile times, no serving overhead (scripts/bench/des.py capacity())",
        "ratios": {r.name: r.value for r in a.ratios},
        "ratio_details": [r.to_dict() for r in a.ratios],
        "ratios_by_mode": {m: {r.name: r.value for r in rs} for m, rs in a.by_mode.items()},
        "knees": a.knee_at,
        "policy_reference_des": a.policy_ref.to_dict() if a.policy_ref else None,
        "constrained": a.constrained.figures if a.constrained else None,
        "wall_s": time.monotonic() - started,
    }


def _means(label: str, metrics: dict[str, float]) -> str:
    return f"{label}: " + ", ".join(f"{k} {v * 1000:.2f} ms" for k, v in metrics.items())


def print_report(
    s: Setup, runs: dict[str, ModeRun], a: Analysis, sampling_timings: list[bench_sampling.Timing] | None
) -> None:
    """The tables, then the ratios, each on its own line and last."""
    args, ref = s.args, s.ref
    print()
    if s.sim:
        print(
            f"reference: {ref['profile']} (time scale {args.time_scale:g}): decode step(1) {ref['step_1_ms']:.2f} ms, "
            f"step({s.n_slots}) {ref['step_batch_ms']:.2f} ms, prefill(1 x {args.prompt_tokens}) "
            f"{ref['prefill_1_ms']:.1f} ms; capacity {s.capacity:.3f} req/s = {s.capacity * s.output_tokens:.0f} "
            f"tok/s (continuous policy saturated, {args.prompt_tokens} prompt / {s.output_tokens} output tokens)"
        )
    else:
        print(f"{s.title}\n{in_process_line(ref)}")
    for mode, run in runs.items():
        c = run.config
        print(
            f"\n{mode}: batchSize {c['batchSize']}, maxBatchDelay {c['maxBatchDelay']}, "
            f"continuousBatching {c.get('continuousBatching', False)}, scheduler {c['scheduler']}"
        )
        print(format_table(run.served, run.limits if s.sim else None))
        if run.handler_metrics:
            print(_means("handler metrics (mean)", run.handler_metrics))
        if run.sampled:
            conc = run.kind("concurrent")
            print(f"\nevery request sampled ({SAMPLED}); the per-slot row: a server with the old per-slot sampler")
            rows = [run.sampled] + ([run.sampled_per_slot] if run.sampled_per_slot else [])
            print(format_table(rows, [conc[1]] * len(rows) if conc and conc[1] else None))
            if run.sampled_metrics:
                print(_means("handler metrics, sampled load (mean)", run.sampled_metrics))
    if s.sim:
        print("(limit: the same load in the discrete-event model of the mode's policy, zero serving overhead)")
    if sampling_timings:
        print("\nhost sampling per step (scripts/bench/sampling.py; P8 reads the stand-in logits):")
        print(bench_sampling.format_table(sampling_timings))
    if a.constrained is not None:
        print()
        print(a.constrained.report)
    if a.policy_ref is not None:
        print(f"\npolicy limits, long run ({args.des_requests} requests per Poisson load):")
        print(des.format_reference(a.policy_ref, s.shape))
    if a.knee_at:
        print("\nknee: the lowest swept load where TTFT p50 (p90) passes 2 x the idle TTFT p50")
        for m in runs:
            parts = [f"{where} {_pct(k.get('p50'))} ({_pct(k.get('p90'))})" for where, k in _knee_rows(a.knee_at, m)]
            print(f"  {m:<10} " + ", ".join(parts))
    for mode, rs in a.by_mode.items():
        if mode != "continuous" and rs:
            print(f"{mode} mode, against its own policy's limit: " + ", ".join(f"{r.name} {r.value:.2f}" for r in rs))
    if a.stage is not None:
        print()
        print(bench_replicas.report(a.stage))
        print_p7_host_time(a)


def in_process_line(ref: dict[str, Any]) -> str:
    """hf: the in-process step loop's best tok/s and step at each batch, and every run's tok/s."""
    best = ", ".join(
        f"batch {b} {tps:.1f} tok/s (step {ref['step_ms_by_batch'][b]:.1f} ms)"
        for b, tps in ref["tokens_per_s_by_batch"].items()
    )
    runs = "; ".join(", ".join(f"{tps:.1f}" for tps in run.values()) for run in ref["tokens_per_s_runs"])
    return f"reference: in-process step loop (scripts/bench/backend.py), best of its runs: {best} (runs: {runs})"


def hf_summary(cont: ModeRun, args: argparse.Namespace) -> str:
    """hf: the idle TTFT (one stream, p50) and the worker's RSS, on two lines."""
    lines = []
    if sync := cont.kind("synchronous"):
        lines.append(
            f"idle TTFT p50 {sync[0].ttft_ms.p50:.1f} ms (one stream, {sync[0].requests_ok} requests, "
            f"prompts {args.prompt_tokens}±{args.prompt_spread} tokens)"
        )
    rss = cont.worker_rss_mib
    if rss.get("peak"):
        lines.append(
            f"worker RSS peak {rss['peak']:.0f} MiB, {rss['after_loads']:.0f} MiB after the loads "
            f"(the TorchServe worker and its children, sampled every {RSS_EVERY_S:g} s)"
        )
    else:
        lines.append("worker RSS: not measured")
    return "\n".join(lines)


def print_p7_host_time(a: Analysis) -> None:
    """The handler's per-step host time over P7's two loads, side by side; a reason when P7 is low."""
    assert a.stage is not None
    plan, p7_ratio = a.stage.plan, next(r for r in a.ratios if r.name == "P7")
    names = dict(zip(("replicas", "single"), plan.p7_names, strict=True))
    print(
        f"\nper-step host time over P7's loads (handler metrics, mean; profile decode step({plan.n_slots}) "
        f"{plan.profile.decode_s(plan.n_slots) * 1000:.1f} ms):"
    )
    for key, label in (("single", "1 replica"), ("replicas", f"{plan.replicas} replicas")):
        metrics = {k: a.p7_metrics[key][k] for k in STEP_METRICS if k in a.p7_metrics.get(key, {})}
        print("  " + (_means(f"{label}, {names[key]}", metrics) if metrics else f"{label}: no metrics scraped"))
    if not p7_ratio.met:
        print("  " + p7_shortfall(a.p7_metrics, plan.replicas))


def p7_shortfall(metrics: dict[str, dict[str, float]], replicas: int) -> str:
    """Where a low P7 shows in the per-step metrics: longer steps in the replicas (host time
    inside the step loop) or not (the time goes between steps or outside the worker)."""
    cpus = os.cpu_count()

    def pair(name: str) -> tuple[float, float] | None:
        one, many = metrics.get("single", {}).get(name), metrics.get("replicas", {}).get(name)
        return (one, many) if one and many else None

    step, trip = pair("llm_decode_step_seconds"), pair("llm_frontend_round_trip_seconds")
    if step is None:
        return f"P7 is below its goal (no step metrics to say where the time went; {cpus} CPUs on this host)"
    figures = f"decode step {step[1] * 1000:.1f} ms with {replicas} replicas against {step[0] * 1000:.1f} ms with one"
    if trip:
        figures += f", frontend round trip {trip[1] * 1000:.1f} against {trip[0] * 1000:.1f} ms"
    if step[1] > 1.05 * step[0]:
        return (
            f"P7 is below its goal: {figures}; the sleeps are the same, so the longer steps are host time: "
            f"{replicas} replica processes, the worker, the frontend and the client share {cpus} CPUs"
        )
    return (
        f"P7 is below its goal with steps about as long as one replica's ({figures}): the time goes between steps "
        f"(admission, the worker's relay of each step, the frontend) on {cpus} shared CPUs"
    )


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    s = set_up(parse_args(argv))
    sampling_timings = None
    constrained = None
    if s.sim:  # before any server runs: the host to itself
        print("[bench] host sampling per step, batched vs per-slot (scripts/bench/sampling.py) ...", file=sys.stderr)
        sampling_timings = bench_sampling.measure(repeats=5, per_slot_repeats=1)
        if s.args.constrained:
            print("[bench] P9: constrained decoding per step (scripts/bench/constrained.py) ...", file=sys.stderr)
            constrained = run_constrained(s.workroot)
    else:
        print("[bench] in-process reference (scripts/bench/backend.py) ...", file=sys.stderr)
        s.ref = in_process_reference(s)
    runs = {mode: run_mode(s, mode) for mode in s.modes}
    stage = bench_replicas.run_stage(s.replicas) if s.replicas else None
    if not s.sim:  # the machine may have been busier before: measure again, keep the faster at each batch
        print("[bench] in-process reference again ...", file=sys.stderr)
        s.ref = best_in_process([s.ref, in_process_reference(s)])
    a = analyse(s, runs, sampling_timings, stage, constrained)
    out = s.args.out or REPO / "bench_results" / f"bench-{s.args.backend}"
    replicas = (a.stage.to_dict() | {"p7_handler_metrics_mean_s": a.p7_metrics}) if a.stage else None
    meta = result_meta(s, a, argv, started)
    path, png = write_suite_results(out, meta, runs, s.capacity, s.title, a.long_run, replicas)
    print_report(s, runs, a, sampling_timings)
    print(f"results: {path}" + (f" and {png}" if png else "") + f" ({time.monotonic() - started:.0f} s)")
    print(json.dumps({"ratios": {r.name: round(r.value, 3) for r in a.ratios}}), file=sys.stderr)
    if not s.sim and (cont := runs.get("continuous")):  # hf: beside the ratios, just before them
        print(hf_summary(cont, s.args))
    for r in a.ratios:
        print(r.line())


if __name__ == "__main__":
    main()
