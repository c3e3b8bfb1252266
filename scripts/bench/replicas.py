"""`make bench`'s replicas stage: P7, and the seed workload on the 3 x TP8 sim layout.

Two torchserve servers with the sim backend, one after the other, same profile and request shape
(default: configs/model-config-sim-3x-tp8.yaml, the Llama-3.1-8B TP8 inf2.48xlarge profile):
  1 replica   scheduler.replicas 1 (batchSize 2 x n_slots): B = n_slots concurrent streams
  R replicas  the config as shipped (R = 3): a guidellm-style throughput sweep of concurrent
              streams, 1, 8, 32, 96 and 128 by default; R x B is always one of the levels
Each load is closed-loop (every stream sends its next request when its last one ends), `rounds`
requests per stream; level 1 is guidellm's `synchronous`. Requests are the seed's workload:
1500 +- 150 prompt tokens as the tiny tokenizer counts them (the sim's prefill time follows
that count), 250 new tokens with ignore_eos, greedy.

  P7 = served output tok/s of R replicas at R x B streams / (R x served tok/s of 1 replica at B)

The `limit` figures are the same loads in the discrete-event model (scripts/bench/des.py), with
R replicas as R independent continuous engines and the streams dealt out evenly among them, as
the dispatcher does (a new request goes to the replica with the fewest sequences). The sweep is
printed beside the published TGI and vLLM figures for the same layout and workload (PUBLISHED), and

  P11 = served output tok/s / the published vLLM tok/s at the same layout and users (P11_PUBLISHED:
        3 replicas at 128 users, 1 replica at 32), TTFT p50 and ITL p50 beside the published ones;
        goal >= 1.0 with TTFT p50 <= the published TTFT. The DES limit's tok/s is printed beside.
scripts/bench/suite.py runs this stage after the scheduler modes (`--replicas`, on by default)
and turns its loads into the P7 ratio.
"""

from __future__ import annotations

import asyncio
import copy
import math
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from handler.backends.sim_profile import Profile, load_profile
from scripts.bench import des
from scripts.bench import server as bench_server
from scripts.bench.client import Lengths, Load, PromptMaker, Target, Workload, run_all
from scripts.bench.stats import LoadSummary, format_table, summarize

REPO = Path(__file__).resolve().parents[2]
SEED_CONFIG = REPO / "configs" / "model-config-sim-3x-tp8.yaml"
SEED_PROFILE = REPO / "profiles" / "llama-3.1-8b-inf2-48xl-tp8.yaml"
SEED_LEVELS = (1, 8, 32, 96, 128)  # 128: the users of the published DP3 x TP8 vLLM run (P11)
SEED_PROMPT_TOKENS, SEED_PROMPT_SPREAD, SEED_OUTPUT_TOKENS = 1500, 150, 250


@dataclass(frozen=True)
class Published:
    """One row of a published serving benchmark, as printed there."""

    server: str
    mode: str
    ttft: str
    itl: str
    tokens_per_s: str


# The table under this heading of shared/inf2-benchmarks.md, verbatim (tests/unit/bench/test_bench_replicas.py
# compares them with the file where it is at hand, ../shared beside the repository).
PUBLISHED_HEADING = (
    "Serving-level, measured with guidellm (Llama-3.1-8B-Instruct, inf2.48xlarge, "
    "3 replicas \N{MULTIPLICATION SIGN} TP8, BS32, seq 4096, 1500 in / 250 out)"
)
PUBLISHED_SOURCE = f"shared/inf2-benchmarks.md, '{PUBLISHED_HEADING}'"
PUBLISHED = (
    Published("TGI neuron", "synchronous", "~316 ms", "~26.8 ms", "~35"),
    Published("TGI neuron", "throughput", "7.2-7.8 s", "~55 ms", "914-929"),
    Published("vLLM (optimum-neuron)", "synchronous", "475 ms", "26.6 ms", "35"),
    Published("vLLM (optimum-neuron)", "throughput", "4.2 s", "49.5 ms", "1226"),
)


@dataclass(frozen=True)
class PublishedLoad:
    """A published vLLM row at one layout and number of users (P11's denominator), its cells as
    printed in the source, and the figures read from them."""

    setup: str
    load: str
    tokens_per_s: str
    ttft: str
    itl: str
    replicas: int
    users: int

    @property
    def tokens(self) -> float:
        return float(self.tokens_per_s)

    @property
    def ttft_ms(self) -> float:
        value, unit = self.ttft.split()
        return float(value) * (1000 if unit == "s" else 1)

    @property
    def itl_ms(self) -> float:
        return float(self.itl.split()[0])


P11_HEADING = (
    "Serving-level, optimum-neuron vLLM on inf2.48xlarge, 2026 reruns (Llama-3.1-8B-Instruct, guidellm, "
    "1500\N{PLUS-MINUS SIGN}150 in / 250\N{PLUS-MINUS SIGN}20 out, TP8, BS32)"
)
P11_SOURCE = (
    "optimum-neuron benchmark/vllm/data-parallel/llama3.1-8b/vllm-results-dp3.csv and "
    f"benchmark/vllm/chunked-prefill/README.md, as summarised in shared/inf2-benchmarks.md, '{P11_HEADING}'"
)
P11_PUBLISHED = (
    PublishedLoad("DP=3 (3 \N{MULTIPLICATION SIGN} TP8 = 24 cores)", "128 users", "1144.5", "4.6 s", "46.0 ms", 3, 128),
    PublishedLoad("1 replica", "throughput (32 users)", "426", "2.14 s", "59.1 ms", 1, 32),
)
P11_GOAL = 1.0


@dataclass(frozen=True)
class P11:
    """Our served load against a published vLLM one at the same layout and users."""

    published: PublishedLoad
    served: LoadSummary
    limit: LoadSummary

    @property
    def value(self) -> float:
        return self.served.output_tokens_per_s / self.published.tokens

    @property
    def limit_value(self) -> float:
        return self.limit.output_tokens_per_s / self.published.tokens

    @property
    def met(self) -> bool:
        return self.value >= P11_GOAL and self.served.ttft_ms.p50 <= self.published.ttft_ms

    def label(self) -> str:
        name = "P11" if self.published.replicas > 1 else "P11-single"
        replicas = f"{self.published.replicas} replica{'s' if self.published.replicas > 1 else ''}"
        return f"{name} ({replicas}, {self.published.users} users)"

    def line(self) -> str:
        p, s = self.published, self.served
        return (
            f"{self.label()} {self.value:.2f}  goal >= {P11_GOAL:g} with TTFT p50 <= {p.ttft} "
            f"{'met' if self.met else 'NOT met'}  = sim {s.output_tokens_per_s:.1f} tok/s (DES limit "
            f"{self.limit.output_tokens_per_s:.1f}, {self.limit_value:.2f}) / vLLM {p.tokens_per_s}; TTFT p50 "
            f"{_duration(s.ttft_ms.p50)} vs {p.ttft}, ITL p50 {s.itl_ms.p50:.1f} ms vs {p.itl}"
        )

    def to_dict(self) -> dict[str, Any]:
        s, p = self.served, self.published
        return {
            "name": self.label(),
            "value": _finite(self.value),
            "limit": _finite(self.limit_value),
            "met": self.met,
            "load": s.name,
            "tokens_per_s": s.output_tokens_per_s,
            "limit_tokens_per_s": self.limit.output_tokens_per_s,
            "ttft_p50_ms": _finite(s.ttft_ms.p50),
            "itl_p50_ms": _finite(s.itl_ms.p50),
            "published": asdict(p),
            "published_ttft_ms": p.ttft_ms,
            "published_itl_ms": p.itl_ms,
            "published_source": P11_SOURCE,
        }


P12_GOAL = 1.3


@dataclass(frozen=True)
class P12:
    """Served TTFT p50 against the reference's (the discrete-event model, where a request reaches
    the engine the instant it is sent) at one load of the seed workload: what the serving path adds
    before a request's prefill."""

    label: str  # e.g. "P12-single (1 replica, 32 streams)"
    served: LoadSummary
    limit: LoadSummary

    @property
    def value(self) -> float:
        return self.served.ttft_ms.p50 / self.limit.ttft_ms.p50

    @property
    def met(self) -> bool:
        return self.value <= P12_GOAL

    def line(self) -> str:
        return (
            f"{self.label} {self.value:.2f}  goal <= {P12_GOAL:g} {'met' if self.met else 'NOT met'}  = served TTFT "
            f"p50 {self.served.ttft_ms.p50:.0f} ms / reference {self.limit.ttft_ms.p50:.0f} ms ({self.served.name})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.label,
            "value": _finite(self.value),
            "met": self.met,
            "load": self.served.name,
            "ttft_p50_ms": _finite(self.served.ttft_ms.p50),
            "reference_ttft_p50_ms": _finite(self.limit.ttft_ms.p50),
        }


# -- what is run -------------------------------------------------------------------------
@dataclass(frozen=True)
class Settings:
    model_dir: Path  # the tokenizer (the sim has no weights)
    workdir: Path  # one folder per server under it
    config: Path = SEED_CONFIG  # the R-replica layout: scheduler.replicas, n_slots, batchSize
    profile: Path = SEED_PROFILE
    levels: tuple[int, ...] = SEED_LEVELS  # the sweep's concurrent streams; R x B is added if missing
    rounds: int = 2  # requests per stream in every load
    streams: int | None = None  # B; default the profile's slots (its compiled batch)
    prompt_tokens: int = SEED_PROMPT_TOKENS
    prompt_spread: int = SEED_PROMPT_SPREAD
    output_tokens: int = SEED_OUTPUT_TOKENS
    time_scale: float = 1.0
    progress: bool = True


@dataclass
class Plan:
    replicas: int  # R
    n_slots: int  # per replica
    streams: int  # B
    profile: Profile  # scaled by time_scale
    shape: des.Shape
    budget: int  # prefill_token_budget
    configs: dict[str, dict[str, Any]]  # "replicas" (R), "single" (1)
    loads: dict[str, list[Load]]  # per server, in order
    p7_names: tuple[str, str]  # (the R-replica load at R x B streams, the 1-replica load at B)


def load_name(streams: int) -> str:
    return "synchronous" if streams == 1 else f"concurrent@{streams}"


def closed_load(streams: int, rounds: int, label: str = "") -> Load:
    return Load("synchronous" if streams == 1 else "concurrent", streams * rounds, streams, label=label)


def plan(s: Settings) -> Plan:
    """The two servers' model-configs and loads."""
    if s.rounds < 1 or s.time_scale <= 0:
        raise ValueError("rounds must be >= 1 and time_scale > 0")
    base = yaml.safe_load(s.config.read_text())
    base["handler"]["sim"]["profile"] = str(s.profile.resolve())
    base["handler"]["sim"]["time_scale"] = s.time_scale
    scheduler = base["scheduler"]
    replicas, n_slots = int(scheduler.get("replicas", 1)), int(scheduler["n_slots"])
    if replicas < 2:
        raise ValueError(f"{s.config}: scheduler.replicas is {replicas}; P7 needs a config with 2 or more")
    profile = des.scaled(load_profile(s.profile), s.time_scale)
    if profile.batch_size != n_slots:
        raise ValueError(f"{s.config}: n_slots {n_slots} is not the profile's batch size {profile.batch_size}")
    streams = s.streams or n_slots
    levels = sorted({*s.levels, replicas * streams})
    if levels[0] < 1:
        raise ValueError(f"concurrency levels must be >= 1, got {levels}")
    loads = {
        "replicas": [closed_load(n, s.rounds) for n in levels],
        "single": [closed_load(streams, s.rounds, label=f"{load_name(streams)} 1 replica")],
    }
    # Room for every stream of the largest load in the worker and the frontend (closed loads
    # never have more requests out than streams).
    top = max(levels)
    base["batchSize"] = max(int(base["batchSize"]), replicas * n_slots)
    base["jobQueueSize"] = max(int(base.get("jobQueueSize", 1)), top)
    single = copy.deepcopy(base)
    single["scheduler"]["replicas"] = 1
    single["batchSize"] = 2 * n_slots  # the suite's continuous rule (with_scheduler)
    single["jobQueueSize"] = max(4 * n_slots, streams)
    return Plan(
        replicas=replicas,
        n_slots=n_slots,
        streams=streams,
        profile=profile,
        shape=des.Shape(s.prompt_tokens, s.output_tokens, s.prompt_spread),
        budget=int(scheduler.get("prefill_token_budget", des.DEFAULT_BUDGET)),
        configs={"replicas": base, "single": single},
        loads=loads,
        p7_names=(load_name(replicas * streams), loads["single"][0].name),
    )


# -- the limit: R continuous engines, the streams dealt out -------------------------------
def deal(total: int, replicas: int) -> list[int]:
    """`total` split as evenly as possible over `replicas`, the first ones taking the rest."""
    return [total // replicas + (k < total % replicas) for k in range(replicas)]


def replicated_limit(profile: Profile, n_slots: int, budget: int, load: Load, shape: des.Shape, replicas: int):
    """A closed load on `replicas` independent continuous engines, the streams (and with them
    the requests) dealt out evenly; one summary over all of them, from t = 0."""
    policy = des.Policy("continuous", n_slots, prefill_token_budget=budget)
    streams_of = deal(load.streams, replicas)
    owner = [k for k, n in enumerate(streams_of) for _ in range(n)]  # stream -> its replica
    requests_of = [0] * replicas
    for stream, n in enumerate(deal(load.requests, load.streams)):  # each stream's requests
        requests_of[owner[stream]] += n
    rows: list[dict[str, Any]] = []
    for k, (streams, requests) in enumerate(zip(streams_of, requests_of, strict=True)):
        if streams and requests:
            part = des.Load(load.kind, requests, streams)
            served = des.simulate(profile, policy, part, replace(shape, seed=shape.seed + k))
            rows += [x.as_bench_request() for x in served]
    summary = summarize(load.name, load.kind, load.streams, 0.0, rows)
    summary.requests = []
    return summary


def limits(p: Plan) -> dict[str, list[LoadSummary]]:
    return {
        "replicas": [
            replicated_limit(p.profile, p.n_slots, p.budget, x, p.shape, p.replicas) for x in p.loads["replicas"]
        ],
        "single": [replicated_limit(p.profile, p.n_slots, p.budget, x, p.shape, 1) for x in p.loads["single"]],
    }


# -- running it --------------------------------------------------------------------------
@dataclass
class ServerRun:
    """One server's loads, their limits, and a metrics scrape before the first load and after each."""

    name: str  # "replicas" | "single"
    replicas: int
    config: dict[str, Any]
    served: list[LoadSummary]
    limits: list[LoadSummary]
    scrapes: list[str] = field(default_factory=list)  # Prometheus text; "" where a scrape failed

    def find(self, name: str) -> tuple[int, LoadSummary, LoadSummary]:
        for i, (served, limit) in enumerate(zip(self.served, self.limits, strict=True)):
            if served.name == name:
                return i, served, limit
        raise KeyError(f"no load {name!r} in the {self.name} run")

    def scrapes_around(self, name: str) -> tuple[str, str]:
        """The scrapes just before and just after load `name` ("" when not taken)."""
        i, _, _ = self.find(name)
        return (self.scrapes[i], self.scrapes[i + 1]) if len(self.scrapes) > i + 1 else ("", "")

    def to_dict(self) -> dict[str, Any]:
        return {
            "replicas": self.replicas,
            "config": self.config,
            "loads": [x.to_dict() for x in self.served],
            "limits": [x.to_dict() for x in self.limits],
        }


@dataclass
class Stage:
    settings: Settings
    plan: Plan
    runs: dict[str, ServerRun]  # "single", "replicas"

    @property
    def p7_loads(self) -> tuple[LoadSummary, LoadSummary, LoadSummary, LoadSummary]:
        """(R replicas at R x B, 1 replica at B, and their limits)."""
        _, many, many_limit = self.runs["replicas"].find(self.plan.p7_names[0])
        _, one, one_limit = self.runs["single"].find(self.plan.p7_names[1])
        return many, one, many_limit, one_limit

    @property
    def p7(self) -> float:
        many, one, _, _ = self.p7_loads
        return many.output_tokens_per_s / (self.plan.replicas * one.output_tokens_per_s)

    @property
    def p7_limit(self) -> float:
        _, _, many, one = self.p7_loads
        return many.output_tokens_per_s / (self.plan.replicas * one.output_tokens_per_s)

    def p11(self) -> list[P11]:
        """P11 for each published load that this stage ran (same replicas and users)."""
        found = []
        for published in P11_PUBLISHED:
            key = "single" if published.replicas == 1 else "replicas"
            if published.replicas not in (1, self.plan.replicas):
                continue
            name = load_name(published.users) + (" 1 replica" if key == "single" else "")
            try:
                _, served, limit = self.runs[key].find(name)
            except KeyError:
                continue
            found.append(P11(published, served, limit))
        return found

    def p12(self) -> list[P12]:
        """P12 at B streams on one replica and at R x B on R replicas (P7's two loads)."""
        many, one, many_limit, one_limit = self.p7_loads
        r, b = self.plan.replicas, self.plan.streams
        return [
            P12(f"P12-single (1 replica, {b} streams)", one, one_limit),
            P12(f"P12 ({r} replicas, {r * b} streams)", many, many_limit),
        ]

    def to_dict(self) -> dict[str, Any]:
        p, s = self.plan, self.settings
        many, one, _, _ = self.p7_loads
        return {
            "profile": p.profile.name,
            "time_scale": s.time_scale,
            "replicas": p.replicas,
            "n_slots": p.n_slots,
            "streams": p.streams,
            "rounds": s.rounds,
            "shape": asdict(p.shape),
            "p7": {
                "value": _finite(self.p7),
                "limit": _finite(self.p7_limit),
                "numerator_load": many.name,
                "numerator_tokens_per_s": many.output_tokens_per_s,
                "denominator_load": one.name,
                "denominator_tokens_per_s": one.output_tokens_per_s,
                "definition": "served output tok/s of R replicas at R x B streams / (R x served output tok/s of "
                "one replica at B streams), same profile and request shape",
            },
            "p11": [x.to_dict() for x in self.p11()],
            "p12": [x.to_dict() for x in self.p12()],
            "runs": {name: run.to_dict() for name, run in self.runs.items()},
            "published": [asdict(x) for x in PUBLISHED],
            "published_source": PUBLISHED_SOURCE,
        }


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def workload(s: Settings) -> Workload:
    """The same prompt and output lengths for both servers (prompts cut from the corpus)."""
    return Workload(
        PromptMaker(s.model_dir, seed=0),
        Lengths(s.prompt_tokens, s.prompt_spread),
        Lengths(s.output_tokens, 0),
        seed=0,
        progress=s.progress,
    )


def _scrape(server: Any) -> str:
    try:
        return server.scrape_metrics()
    except Exception as exc:  # the figures stand without the host-time cross-check
        print(f"[bench] could not scrape metrics: {exc}", file=sys.stderr)
        return ""


def run_server(name: str, replicas: int, workdir: Path, s: Settings, config: dict[str, Any], loads: list[Load]):
    """One torchserve: its loads in order, a metrics scrape before the first and after each."""
    print(f"[bench] replicas stage, {replicas} replica(s): starting torchserve in {workdir} ...", file=sys.stderr)
    server = bench_server.start(workdir, s.model_dir, config, timeout=300)
    served, scrapes = [], []
    try:
        target = Target(server.url, server.model_name, "native", server.headers)
        work = workload(s)
        scrapes.append(_scrape(server))
        for load in loads:
            [summary] = asyncio.run(run_all(target, [load], work, sweep_streams=load.streams))
            served.append(summary)
            scrapes.append(_scrape(server))
    finally:
        server.stop()
    return ServerRun(name, replicas, config, served, [], scrapes)


def run_stage(s: Settings) -> Stage:
    """Both servers (one replica first), every load, and the limits."""
    p = plan(s)
    limit = limits(p)
    expected = sum(x.duration_s for xs in limit.values() for x in xs)
    print(
        f"[bench] replicas stage: {p.replicas} x {p.n_slots} slots ({p.profile.name}), B = {p.streams}; "
        f"the loads take about {expected:.0f} s at the limit: "
        + ", ".join(x.name for xs in p.loads.values() for x in xs),
        file=sys.stderr,
    )
    runs = {}
    for name, replicas in (("single", 1), ("replicas", p.replicas)):
        run = run_server(name, replicas, s.workdir.resolve() / name, s, p.configs[name], p.loads[name])
        run.limits = limit[name]
        runs[name] = run
    return Stage(s, p, runs)


# -- the report --------------------------------------------------------------------------
def describe(stage: Stage) -> str:
    p, s = stage.plan, stage.settings
    return (
        f"{p.profile.name}, {p.replicas} replicas x {p.n_slots} slots (sim, time scale {s.time_scale:g}); "
        f"prompts {s.prompt_tokens}±{s.prompt_spread} tokens (tiny tokenizer), {s.output_tokens} new tokens "
        f"with ignore_eos; closed-loop concurrent streams, {s.rounds} requests per stream"
    )


def format_seed_table(stage: Stage) -> str:
    """Ours (simulated), one row per concurrency level, then the published rows."""
    ours = "ours (simulated)"
    published = [(f"{row.server} (published)", row) for row in PUBLISHED]
    width = max(len(ours), *(len(name) for name, _ in published))
    header = (
        f"{'server':<{width}} {'load':<14} {'ok/fail':>8} {'out tok/s':>10} {'TTFT p50':>10} {'TTFT p90':>10} "
        f"{'ITL p50':>9} {'latency p50':>11} | {'limit tok/s':>11}"
    )
    lines = [header, "-" * len(header)]
    run = stage.runs["replicas"]
    for served, limit in zip(run.served, run.limits, strict=True):
        lines.append(
            f"{ours:<{width}} {served.name:<14} {f'{served.requests_ok}/{served.requests_failed}':>8} "
            f"{served.output_tokens_per_s:>10.1f} {_duration(served.ttft_ms.p50):>10} "
            f"{_duration(served.ttft_ms.p90):>10} {f'{served.itl_ms.p50:.1f} ms':>9} "
            f"{f'{served.latency_s.p50:.2f} s':>11} | {limit.output_tokens_per_s:>11.1f}"
        )
    for name, row in published:
        lines.append(
            f"{name:<{width}} {row.mode:<14} {'-':>8} {row.tokens_per_s:>10} {row.ttft:>10} {'-':>10} "
            f"{row.itl:>9} {'-':>11} | {'-':>11}"
        )
    return "\n".join(lines)


def _duration(ms: float) -> str:
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.2f} s"


def report(stage: Stage) -> str:
    """The stage's tables: every load with its limit, then the seed workload beside the published figures."""
    many, one = stage.runs["replicas"], stage.runs["single"]
    p = stage.plan
    text = [
        f"replicas: {describe(stage)}",
        f"{p.replicas} replicas: batchSize {many.config['batchSize']}, scheduler {many.config['scheduler']}; "
        f"1 replica: batchSize {one.config['batchSize']}",
        format_table(one.served + many.served, one.limits + many.limits),
        f"(limit: the same loads in the discrete-event model, {p.replicas} continuous engines with the streams "
        "dealt out evenly; zero serving overhead)",
        "",
        f"seed workload, simulated: {describe(stage)}; beside the published figures for the layout "
        f"({PUBLISHED_SOURCE}; guidellm throughput mode runs at its maximum concurrency)",
        format_seed_table(stage),
        "(published rows as printed in the source, which does not say which statistic its TTFT and ITL are)",
        *format_p11(stage),
        "",
        f"serving overhead before the prefill, P12 = served TTFT p50 / the reference's at the same load; "
        f"goal <= {P12_GOAL:g}",
        *(f"  {x.line()}" for x in stage.p12()),
    ]
    if stage.settings.time_scale != 1.0:
        text.append(f"(every simulated time x {stage.settings.time_scale:g}: not comparable with the published rows)")
    return "\n".join(text)


def format_p11(stage: Stage) -> list[str]:
    """P11's lines (indented: the suite's own ratio lines are the ones that start with P)."""
    found = stage.p11()
    if not found:
        return []
    return [
        "",
        f"against the published vLLM runs, P11 = our served output tok/s (sim) / the published figure at the same "
        f"layout and users ({P11_SOURCE}); "
        f"goal >= {P11_GOAL:g} with TTFT p50 <= the published TTFT",
        *(f"  {x.line()}" for x in found),
    ]


def parse_levels(text: str) -> tuple[int, ...]:
    levels = tuple(int(x) for x in text.split(",") if x.strip())
    if not levels or min(levels) < 1:
        raise ValueError(f"concurrency levels must be positive integers, got {text!r}")
    return levels
