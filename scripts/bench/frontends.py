"""`make bench-frontends`: the same sim engine, profile and loads served by TorchServe and by the
ASGI frontend (`python -m handler.frontend`), one after the other, in one run (issue 35).

Per frontend, continuous mode (the ASGI frontend schedules continuously only), the suite's loads
(scripts/bench/suite.py, Llama-2-7B inf2.48xlarge TP24 profile, 8 slots, 100±10 / 128 tokens):
one stream, 8 concurrent streams, Poisson at 50 % and 70 % of capacity; then a second server of
each frontend with the replicas stage's seed workload on one replica (scripts/bench/replicas.py:
Llama-3.1-8B TP8, 32 slots, 1500±150 / 250 tokens, 32 closed-loop streams, 8 requests each as
docs/performance.md measures P12). TorchServe in static mode runs the 50 % load once more, for P4.
Printed and recorded per frontend:
  idle TTFT p50 (one stream) and P1-P3 as the suite defines them (P1-asgi, ...);
  P4  = static TorchServe's TTFT p50 at 50 % / that frontend's continuous TTFT p50 at 50 %
  P12 = served TTFT p50 / the discrete-event reference's, seed workload, 32 streams, one replica
        (goal <= 1.1: issue 35's goal for the ASGI frontend; TorchServe's beside it)
  P14 = ASGI served output tok/s / TorchServe's at 8 streams, same engine and profile (goal >= 1.0)
The load average (1, 5, 15 min) at the start and the end is printed and recorded beside them.
Results: bench_results/bench-frontends.json. A benchmark, not a test: it decides nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx

from scripts.bench import des, suite
from scripts.bench import replicas as bench_replicas
from scripts.bench import server as bench_server
from scripts.bench.client import Load, Target, run_all
from scripts.bench.stats import LoadSummary, format_table
from scripts.serve.local_asgi import start_asgi_frontend

REPO = Path(__file__).resolve().parents[2]
FRONTENDS = ("torchserve", "asgi")
P12_GOAL: tuple[str, float] = ("<=", 1.1)
P14_GOAL: tuple[str, float] = (">=", 1.0)
START_TIMEOUT_S = 300


# -- the servers ---------------------------------------------------------------------------
def start(
    frontend: str, workdir: Path, model_dir: Path, config: dict[str, Any], asgi_env: dict[str, str] | None = None
) -> Any:
    """A server of `frontend` with `config` (the ASGI frontend as frontend_admission.py starts it,
    `asgi_env` added to its environment)."""
    print(f"[bench] {frontend}: starting it in {workdir} ...", file=sys.stderr)
    if frontend == "asgi":
        return start_asgi_frontend(workdir, model_dir, config, env=asgi_env)
    return bench_server.start(workdir, model_dir, config, timeout=START_TIMEOUT_S)


def scrape(server: Any) -> str:
    """Prometheus text: TorchServe's metrics port, or the ASGI frontend's /metrics; "" on failure."""
    try:
        if hasattr(server, "scrape_metrics"):
            return str(server.scrape_metrics())
        return httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    except Exception as exc:  # the figures stand without the handler metrics
        print(f"[bench] could not scrape metrics: {exc}", file=sys.stderr)
        return ""


def serve_loads(
    frontend: str,
    workdir: Path,
    model_dir: Path,
    config: dict[str, Any],
    loads: list[Load],
    work: Any,
    asgi_env: dict[str, str] | None = None,
) -> tuple[list[LoadSummary], dict[str, float]]:
    """Every load in order on one fresh server; the handler metrics' means over all of them."""
    server = start(frontend, workdir, model_dir, config, asgi_env)
    try:
        target = Target(server.url, server.model_name, "native", server.headers)
        before = suite.histogram_totals(scrape(server))
        served = [asyncio.run(run_all(target, [x], work, sweep_streams=x.streams))[0] for x in loads]
        return served, suite.handler_metrics(scrape(server), before)
    finally:
        server.stop()


# -- the ratios ----------------------------------------------------------------------------
def per_frontend(ratio: suite.Ratio, frontend: str) -> suite.Ratio:
    """`ratio` named for its frontend (P1 -> P1-asgi) with the suite's goal for it."""
    return replace(ratio, name=f"{ratio.name}-{frontend}", goal_at=suite.GOALS[ratio.name])


def p12(frontend: str, served: LoadSummary, reference: LoadSummary) -> suite.Ratio:
    return suite.Ratio(
        f"P12-{frontend}",
        served.ttft_ms.p50 / reference.ttft_ms.p50,
        f"served TTFT p50 {served.ttft_ms.p50:.0f} ms ({frontend}, seed workload, {served.streams} streams, 1 replica)",
        f"reference {reference.ttft_ms.p50:.0f} ms (discrete-event, same load)",
        limit=1.0,
        goal_at=P12_GOAL,
    )


def p14(asgi: LoadSummary, torchserve: LoadSummary) -> suite.Ratio:
    return suite.Ratio(
        "P14",
        asgi.output_tokens_per_s / torchserve.output_tokens_per_s,
        f"ASGI served {asgi.output_tokens_per_s:.1f} tok/s ({asgi.streams} streams)",
        f"TorchServe served {torchserve.output_tokens_per_s:.1f} tok/s ({torchserve.streams} streams)",
        goal_at=P14_GOAL,
    )


def p4(static: LoadSummary, continuous: LoadSummary, frontend: str, fraction: float) -> suite.Ratio:
    ratio = suite.p4(static, continuous, fraction, None)
    return replace(
        ratio,
        name=f"P4-{frontend}",
        denominator=f"{frontend} continuous TTFT p50 {continuous.ttft_ms.p50:.1f} ms, both at {fraction:.0%} "
        f"of capacity ({continuous.offered_rate:.2f} req/s)",
        numerator=f"static TorchServe TTFT p50 {static.ttft_ms.p50:.1f} ms",
        goal_at=suite.GOALS["P4"],
    )


@dataclass
class FrontendRun:
    frontend: str
    run: suite.ModeRun  # the suite's loads, continuous
    seed: LoadSummary | None = None  # the seed workload, 32 streams, one replica
    seed_metrics: dict[str, float] = field(default_factory=dict)

    def idle_ttft_ms(self) -> float | None:
        sync = self.run.kind("synchronous")
        return sync[0].ttft_ms.p50 if sync else None


def frontend_ratios(
    runs: dict[str, FrontendRun],
    step_1_ms: float,
    p3_fraction: float,
    p4_fraction: float,
    static: suite.ModeRun | None,
    seed_reference: LoadSummary | None,
) -> list[suite.Ratio]:
    """P1-P3 (and P4 with a static run) per frontend, P12 per frontend, then P14."""
    out: list[suite.Ratio] = []
    static_load = static.at(p4_fraction) if static else None
    for name, fr in runs.items():
        out += [per_frontend(r, name) for r in suite.mode_ratios(fr.run, step_1_ms, p3_fraction)]
        if static_load and (cont := fr.run.at(p4_fraction)):
            out.append(p4(static_load[0], cont[0], name, p4_fraction))
    out += [p12(name, fr.seed, seed_reference) for name, fr in runs.items() if fr.seed and seed_reference]
    if "asgi" in runs and "torchserve" in runs:
        asgi, ts = runs["asgi"].run.kind("concurrent"), runs["torchserve"].run.kind("concurrent")
        if asgi and ts:
            out.append(p14(asgi[0], ts[0]))
    return out


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontends", default=",".join(FRONTENDS), help="comma-separated: torchserve,asgi")
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama", help="the tokenizer")
    parser.add_argument("--profile", type=Path, default=suite.DEFAULT_PROFILE)
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-frontends")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "bench-frontends")
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--static", action=argparse.BooleanOptionalAction, default=True, help="P4 (TorchServe static)")
    parser.add_argument("--seed", action=argparse.BooleanOptionalAction, default=True, help="P12 (seed workload)")
    parser.add_argument(
        "--seed-rounds",
        type=int,
        default=8,
        help="requests per stream in P12's load (8: with 2, half are first-round requests queued behind 31 "
        "prefills and the p50 falls between the groups; docs/performance.md, P12)",
    )
    parser.add_argument(
        "--asgi-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="set in the ASGI frontend's environment (e.g. OMP_NUM_THREADS=1); repeatable",
    )
    parser.add_argument("--no-progress", action="store_true")
    args, suite_argv = parser.parse_known_args(argv)
    args.frontend_list = [f.strip() for f in args.frontends.split(",") if f.strip()]
    if bad := [f for f in args.frontend_list if f not in FRONTENDS]:
        parser.error(f"unknown frontend(s) {bad}: use {', '.join(FRONTENDS)}")
    if bad := [x for x in args.asgi_env if "=" not in x]:
        parser.error(f"--asgi-env takes NAME=VALUE, got {bad}")
    args.asgi_environment = dict(x.split("=", 1) for x in args.asgi_env)
    args.suite_argv = suite_argv  # the suite's load options (--sync-requests, --concurrent-rounds, ...)
    return args


def suite_setup(args: argparse.Namespace) -> suite.Setup:
    """The suite's continuous loads and config (no sweep, no replicas, no P2s or P9)."""
    argv = ["--backend", "sim", "--profile", str(args.profile), "--model-dir", str(args.model_dir)]
    argv += ["--workdir", str(args.workdir), "--time-scale", str(args.time_scale), "--modes", "continuous"]
    argv += ["--sweep", "none", "--no-replicas", "--no-sampled", "--no-constrained", *args.suite_argv]
    if args.no_progress:
        argv.append("--no-progress")
    return suite.set_up(suite.parse_args(argv))


def static_config(s: suite.Setup) -> dict[str, Any]:
    a = s.args
    base = suite.sim_model_config(a.profile, a.time_scale)
    config = suite.with_scheduler(base, "static", s.n_slots, max_batch_delay_ms=a.max_batch_delay_ms)
    config["jobQueueSize"] = s.configs["continuous"]["jobQueueSize"]
    return config


def seed_settings(args: argparse.Namespace) -> bench_replicas.Settings:
    return bench_replicas.Settings(
        model_dir=args.model_dir.resolve(),
        workdir=args.workdir.resolve() / "seed",
        rounds=args.seed_rounds,
        time_scale=args.time_scale,
        progress=not args.no_progress,
    )


@dataclass
class Seed:
    """P12's server: the replicas stage's one-replica config and load (32 streams), its reference."""

    settings: bench_replicas.Settings
    plan: bench_replicas.Plan
    reference: LoadSummary

    @classmethod
    def of(cls, args: argparse.Namespace) -> Seed:
        settings = seed_settings(args)
        p = bench_replicas.plan(settings)
        [load] = p.loads["single"]
        return cls(settings, p, bench_replicas.replicated_limit(p.profile, p.n_slots, p.budget, load, p.shape, 1))


def run_frontend(
    frontend: str, s: suite.Setup, limits: list[LoadSummary | None], seed: Seed | None, asgi_env: dict[str, str]
) -> FrontendRun:
    """The suite's continuous loads on one server of `frontend`, then the seed load on another."""
    workroot, config = s.workroot / frontend, s.configs["continuous"]
    work = suite.fresh_workload(s.model_dir, s.args, s.output_tokens)
    served, metrics = serve_loads(
        frontend, workroot / "continuous", s.model_dir, config, list(s.plan.loads), work, asgi_env
    )
    fr = FrontendRun(frontend, suite.ModeRun("continuous", config, served, limits, s.plan.fractions, metrics))
    if seed:
        work = bench_replicas.workload(seed.settings)
        loads, config = seed.plan.loads["single"], seed.plan.configs["single"]
        [fr.seed], fr.seed_metrics = serve_loads(
            frontend, workroot / "seed", s.model_dir, config, loads, work, asgi_env
        )
    return fr


def run_static(s: suite.Setup) -> suite.ModeRun:
    """TorchServe in static mode, P4's load only."""
    a = s.args
    loads = [x for x in s.plan.loads if x.name in s.plan.fractions and s.plan.fractions[x.name] == a.p4_fraction]
    assert s.profile is not None
    policy = des.Policy("static", s.n_slots, max_batch_delay_s=a.max_batch_delay_ms / 1000)
    config = static_config(s)
    work = suite.fresh_workload(s.model_dir, a, s.output_tokens)
    served, metrics = serve_loads("torchserve", s.workroot / "torchserve" / "static", s.model_dir, config, loads, work)
    limits: list[LoadSummary | None] = list(suite.des_limits(s.profile, policy, loads, s.shape, seed=0))
    return suite.ModeRun("static", config, served, limits, s.plan.fractions, metrics)


def main(argv: list[str] | None = None) -> None:
    started = time.monotonic()
    args = parse_args(argv)
    s = suite_setup(args)
    assert s.profile is not None
    load_avg = {"start": list(os.getloadavg())}
    policy = des.Policy("continuous", s.n_slots, prefill_token_budget=s.args.prefill_token_budget)
    limits: list[LoadSummary | None] = list(suite.des_limits(s.profile, policy, s.plan.loads, s.shape, seed=0))
    seed = Seed.of(args) if args.seed else None
    runs = {f: run_frontend(f, s, limits, seed, args.asgi_environment) for f in args.frontend_list}
    static = run_static(s) if args.static and "torchserve" in runs else None
    load_avg["end"] = list(os.getloadavg())
    ratios = frontend_ratios(
        runs, s.ref["step_1_ms"], s.args.load_fraction, s.args.p4_fraction, static, seed.reference if seed else None
    )
    path = write(args.out, s, runs, static, seed, ratios, load_avg, time.monotonic() - started, args.asgi_environment)
    print_report(s, runs, static, seed, ratios, load_avg, args.asgi_environment)
    print(f"results: {path} ({time.monotonic() - started:.0f} s)")
    for r in ratios:
        print(r.line())


# -- results -------------------------------------------------------------------------------
def write(
    out: Path,
    s: suite.Setup,
    runs: dict[str, FrontendRun],
    static: suite.ModeRun | None,
    seed: Seed | None,
    ratios: list[suite.Ratio],
    load_avg: dict[str, list[float]],
    wall_s: float,
    asgi_env: dict[str, str],
) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    frontends = {
        name: {
            "idle_ttft_p50_ms": fr.idle_ttft_ms(),
            "continuous": fr.run.to_dict(s.capacity),
            "seed": fr.seed.to_dict() if fr.seed else None,
            "seed_handler_metrics_mean_s": fr.seed_metrics,
            "ratios": {r.name: r.value for r in ratios if r.name.endswith(f"-{name}")},
        }
        for name, fr in runs.items()
    }
    meta = {
        "title": s.title,
        "argv": sys.argv[1:],
        "reference": s.ref,
        "capacity_req_per_s": s.capacity,
        "load_average": load_avg,
        "asgi_env": asgi_env,
        "cpus": os.cpu_count(),
        "seed": {
            "profile": seed.plan.profile.name,
            "streams": seed.plan.streams,
            "rounds": seed.settings.rounds,
            "shape": seed.plan.shape.__dict__,
            "reference": seed.reference.to_dict(),
        }
        if seed
        else None,
        "ratios": {r.name: r.value for r in ratios},
        "ratio_details": [r.to_dict() for r in ratios],
        "wall_s": wall_s,
    }
    body = {"meta": meta, "frontends": frontends, "static": static.to_dict(s.capacity) if static else None}
    path.write_text(json.dumps(body, indent=1))
    return path


def print_report(
    s: suite.Setup,
    runs: dict[str, FrontendRun],
    static: suite.ModeRun | None,
    seed: Seed | None,
    ratios: list[suite.Ratio],
    load_avg: dict[str, list[float]],
    asgi_env: dict[str, str] | None = None,
) -> None:
    ref = s.ref
    print(
        f"\nreference: {ref['profile']}: decode step(1) {ref['step_1_ms']:.2f} ms, step({s.n_slots}) "
        f"{ref['step_batch_ms']:.2f} ms; capacity {s.capacity:.3f} req/s"
    )
    for name, fr in runs.items():
        print(f"\n{name}, continuous: scheduler {fr.run.config['scheduler']}")
        print(format_table(fr.run.served, fr.run.limits))
        if fr.run.handler_metrics:
            print(suite._means("handler metrics (mean)", fr.run.handler_metrics))
        if fr.seed and seed:
            print(f"{name}, seed workload ({seed.plan.profile.name}, 1 replica):")
            print(format_table([fr.seed], [seed.reference]))
    if static:
        print("\ntorchserve, static (P4's load):")
        print(format_table(static.served, static.limits))
    print("\nside by side:")
    print(side_by_side(runs, ratios))
    start, end = fmt_load(load_avg["start"]), fmt_load(load_avg["end"])
    print(f"load average (1, 5, 15 min) at the start {start}, at the end {end} ({os.cpu_count()} CPUs)")
    if asgi_env:
        print(f"the ASGI frontend's environment: {asgi_env}")


def fmt_load(values: list[float]) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def side_by_side(runs: dict[str, FrontendRun], ratios: list[suite.Ratio]) -> str:
    """One row per figure, one column per frontend."""
    names = list(runs)
    by_name = {r.name: r.value for r in ratios}
    rows = [("idle TTFT p50 ms", [runs[n].idle_ttft_ms() for n in names])]
    conc = [runs[n].run.kind("concurrent") for n in names]
    rows.append(("tok/s at 8 streams", [c[0].output_tokens_per_s if c else None for c in conc]))
    rows.append(("seed TTFT p50 ms", [runs[n].seed.ttft_ms.p50 if runs[n].seed else None for n in names]))
    for base in ("P1", "P2", "P3", "P4", "P12"):
        rows.append((base, [by_name.get(f"{base}-{n}") for n in names]))
    width = 20
    lines = [f"{'':<{width}}" + "".join(f"{n:>12}" for n in names)]
    for label, values in rows:
        lines.append(f"{label:<{width}}" + "".join(f"{'-' if v is None else f'{v:.2f}':>12}" for v in values))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
