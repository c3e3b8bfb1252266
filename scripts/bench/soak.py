"""`make soak`: serve the sim backend for minutes under a mixed open load, and account for every request.

The script starts its own torchserve (scripts/serve/local_torchserve.py, via the bench's
bench_server) with configs/model-config-sim.yaml, and drives an open Poisson load at a
fraction (default 70 %) of capacity. Capacity is what `make bench` uses: the
discrete-event continuous policy's saturated throughput at the mix's mean lengths
(scripts/bench/des.py). The mix:
  - routes: native NDJSON (/predictions/<m>), OpenAI v1/completions and v1/chat/completions;
    streamed and not; greedy and sampled; prompt and output lengths drawn per request; some
    requests stop at the model's EOS, the rest run to max_new_tokens;
  - 10 % of the valid requests are streamed by clients that disconnect after their first
    chunk or a few more ("cancelled");
  - 1 % invalid requests (bad JSON, out-of-range values, wrong types, an unknown route, ...),
    each of which must get a 4xx with a JSON error body.
Every valid request ends one of three ways: completed (a finish_reason and usage arrived),
cancelled (we cut it), or lost: anything else (a connection error, a timeout, a 5xx, a
response that ended without a finish_reason, an in-band error line).

It samples the RSS of the worker processes (the frontend's children and theirs: replicas) as it goes. After the
load it waits for the engine to drain and reads the handler's slot gauges
(llm_slots_occupied, llm_requests_waiting) from the Prometheus metrics: both must be 0.

Exit status 1 on any lost valid request, any invalid request not answered with a 4xx JSON
error, or a slot or waiting request left over; the report goes to bench_results/soak.json.

    python -m scripts.bench.soak --minutes 2
    python -m scripts.bench.soak --minutes 2 --replicas 2   # two model copies behind the one worker
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from handler.backends.sim_profile import load_profile
from scripts.bench import des
from scripts.bench import server as bench_server
from scripts.bench.client import Lengths, PromptMaker, _parse_event
from scripts.bench.stats import arrival_offsets, percentile
from scripts.bench.suite import DEFAULT_PROFILE, sim_model_config
from scripts.serve.local_torchserve import TorchServe

REPO = Path(__file__).resolve().parents[2]
ROUTES = ("native", "completions", "chat")
GAUGES = ("llm_slots_occupied", "llm_requests_waiting")
INVALID_KINDS = (
    "bad_json",
    "negative_max_new_tokens",
    "temperature_string",
    "top_p_above_1",
    "empty_prompt",
    "missing_prompt",
    "openai_negative_max_tokens",
    "openai_no_messages",
    "openai_bad_json",
    "unknown_route",
)


# -- what one request is -----------------------------------------------------------------
@dataclass(frozen=True)
class Mix:
    """The load's shape: shares and length distributions."""

    disconnect: float = 0.10  # of the valid requests: streamed, cut by the client mid-stream
    invalid: float = 0.01  # of all requests
    streamed: float = 0.75  # of the valid requests that are not cut
    natural_eos: float = 0.2  # stop at the model's EOS (else ignore_eos: run to max_new_tokens)
    sampled: float = 0.3
    prompt: Lengths = field(default_factory=lambda: Lengths(160, 120))  # tokens
    output: Lengths = field(default_factory=lambda: Lengths(128, 80))  # max_new_tokens

    def shape(self) -> des.Shape:
        """The DES shape for capacity: mean prompt (with its spread) and mean output length."""
        return des.Shape(self.prompt.mean, self.output.mean, self.prompt.spread)


@dataclass(frozen=True)
class Planned:
    index: int
    offset_s: float  # when to send it, from the load's start
    route: str  # native | completions | chat | invalid
    stream: bool
    body: bytes
    path: str  # after /predictions/<model>
    cut_after: int | None = None  # close the connection after this many chunks
    invalid_kind: str | None = None


def plan_request(index: int, offset_s: float, rng: random.Random, prompts: PromptMaker, mix: Mix, model: str):
    """One request of the mix, drawn from `rng`; every (1 / mix.invalid)-th is invalid, its
    kind in turn, so even a short run sends some."""
    every = round(1 / mix.invalid) if mix.invalid > 0 else 0
    if every and index % every == every // 2:
        kind = INVALID_KINDS[(index // every) % len(INVALID_KINDS)]
        path, body = invalid_request(kind, model)
        return Planned(index, offset_s, "invalid", False, body, path, invalid_kind=kind)
    route = rng.choice(ROUTES)
    cut_after = rng.randint(1, 5) if rng.random() < mix.disconnect else None
    stream = cut_after is not None or rng.random() < mix.streamed
    prompt = prompts.make(min(max(mix.prompt.draw(rng), 4), 1500))  # a 1-token cut can decode to blanks
    max_tokens = min(mix.output.draw(rng), 1024)
    params: dict[str, Any] = {"ignore_eos": rng.random() >= mix.natural_eos}
    if rng.random() < mix.sampled:
        params.update(temperature=round(rng.uniform(0.5, 1.2), 2), top_p=0.95, seed=rng.randrange(2**31))
    if route == "native":
        body = {"prompt": prompt, "max_new_tokens": max_tokens, "stream": stream, **params}
        path = ""
    else:
        body = {"model": model, "max_tokens": max_tokens, "stream": stream, **params}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if route == "completions":
            body["prompt"] = prompt
            path = "/1.0/v1/completions"
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
            path = "/1.0/v1/chat/completions"
    return Planned(index, offset_s, route, stream, json.dumps(body).encode(), path, cut_after)


def invalid_request(kind: str, model: str) -> tuple[str, bytes]:
    """(path, body) of one request the server must refuse with a 4xx JSON error."""
    native: dict[str, Any] = {"prompt": "Today the weather is", "max_new_tokens": 8}
    bodies: dict[str, tuple[str, Any]] = {
        "bad_json": ("", b'{"prompt": "Today the weather is", "max_new_tokens": 8'),
        "negative_max_new_tokens": ("", {**native, "max_new_tokens": -5}),
        "temperature_string": ("", {**native, "temperature": "hot"}),
        "top_p_above_1": ("", {**native, "top_p": 2.0}),
        "empty_prompt": ("", {**native, "prompt": ""}),
        "missing_prompt": ("", {"max_new_tokens": 8}),
        "openai_negative_max_tokens": ("/1.0/v1/completions", {"model": model, "prompt": "Hi", "max_tokens": -1}),
        "openai_no_messages": ("/1.0/v1/chat/completions", {"model": model, "messages": []}),
        "openai_bad_json": ("/1.0/v1/completions", b'{"model": "x", "prompt": '),
        "unknown_route": ("/1.0/v1/embeddings", {"model": model, "input": "Hi"}),
    }
    path, body = bodies[kind]
    return path, body if isinstance(body, bytes) else json.dumps(body).encode()


# -- sending it --------------------------------------------------------------------------
@dataclass
class Outcome:
    index: int
    route: str
    stream: bool
    planned_cut: bool
    invalid_kind: str | None = None
    status: int | None = None
    result: str = "lost"  # completed | cancelled | lost | refused (invalid, 4xx JSON) | accepted (invalid, wrong)
    error: str | None = None  # the error type when not completed / refused
    finish_reason: str | None = None
    completion_tokens: int = 0
    chunks: int = 0
    sent_at: float = 0.0
    first_chunk_s: float | None = None
    ended_s: float = 0.0


def _final_fields(route: str, obj: dict[str, Any]) -> tuple[str | None, int, Any]:
    """(finish_reason, completion tokens, error) of a non-streamed body."""
    usage = obj.get("usage") or {}
    if route == "native":
        return obj.get("finish_reason"), int(usage.get("completion_tokens", 0)), obj.get("error")
    choices = obj.get("choices") or [{}]
    return choices[0].get("finish_reason"), int(usage.get("completion_tokens", 0)), obj.get("error")


def _error_type(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("type") or error.get("message") or error)[:80]
    return str(error)[:80]


async def send(client: httpx.AsyncClient, url: str, headers: dict[str, str], planned: Planned) -> Outcome:
    out = Outcome(planned.index, planned.route, planned.stream, planned.cut_after is not None, planned.invalid_kind)
    out.sent_at = time.perf_counter()
    api = "native" if planned.route == "native" else "openai"
    try:
        async with client.stream("POST", url + planned.path, content=planned.body, headers=headers) as response:
            out.status = response.status_code
            if planned.route == "invalid":
                await response.aread()
                _judge_invalid(out, response)
            elif response.status_code != 200:
                await response.aread()
                out.error = f"HTTP {response.status_code} {_body_type(response)}"
            elif not planned.stream:
                await response.aread()
                finish, tokens, error = _final_fields(planned.route, response.json())
                out.first_chunk_s = time.perf_counter() - out.sent_at
                out.finish_reason, out.completion_tokens = finish, tokens
                out.error = f"error body: {_error_type(error)}" if error else None
            else:
                await _read_stream(response, api, planned, out)
    except (httpx.HTTPError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        out.error = type(exc).__name__
    out.ended_s = time.perf_counter() - out.sent_at
    if planned.route != "invalid":
        out.result = _classify(out)
    return out


async def _read_stream(response: httpx.Response, api: str, planned: Planned, out: Outcome) -> None:
    async for line in response.aiter_lines():
        if not line.strip():
            continue
        _, usage, finish, error = _parse_event(api, line)
        out.chunks += 1
        if out.first_chunk_s is None:
            out.first_chunk_s = time.perf_counter() - out.sent_at
        if usage:
            out.completion_tokens = int(usage.get("completion_tokens", 0))
        out.finish_reason = finish or out.finish_reason
        if error:
            out.error = f"in-band error: {error[:60]}"
        if planned.cut_after is not None and out.chunks >= planned.cut_after and out.finish_reason is None:
            return  # leaving the block closes the connection mid-stream


def _classify(out: Outcome) -> str:
    if out.error is None and out.finish_reason is not None:
        return "completed"
    if out.error is None and out.planned_cut and out.chunks > 0:
        return "cancelled"
    if out.error is None:
        out.error = "ended without finish_reason"
    return "lost"


def _body_type(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return "(not JSON)"
    error = body.get("error") if isinstance(body, dict) else None
    if error is not None:
        return _error_type(error)
    return str(body.get("type", "")) if isinstance(body, dict) else ""


def _judge_invalid(out: Outcome, response: httpx.Response) -> None:
    try:
        body = response.json()
    except ValueError:
        body = None
    if 400 <= response.status_code < 500 and isinstance(body, dict) and "error" in body:
        out.result = "refused"
        out.error = f"{response.status_code} {_error_type(body['error'])}"
    else:
        out.result = "accepted"
        out.error = f"{out.invalid_kind}: HTTP {response.status_code} {response.text[:80]!r}"


# -- watching the worker -----------------------------------------------------------------
def frontend_pid(server: TorchServe) -> int | None:
    """TorchServe writes its pid file into its temp dir (the server's own workdir here)."""
    try:
        return int((server.workdir / ".model_server.pid").read_text().strip())
    except (OSError, ValueError):
        return None


def worker_rss(pid: int | None) -> dict[int, int]:
    """RSS (bytes) of each Python worker: the frontend's child processes."""
    if pid is None:
        return {}
    out: dict[int, int] = {}
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return out
    for child in children:
        try:
            out[child.pid] = child.memory_info().rss
        except psutil.Error:
            continue
    return out


def gauges(text: str) -> dict[str, float]:
    """The slot gauges from a Prometheus scrape (summed over label sets); absent ones missing."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        for name in GAUGES:
            if line.startswith(name + "{") or line.startswith(name + " "):
                values[name] = values.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return values


async def settle(server: TorchServe, timeout_s: float) -> dict[str, float]:
    """Poll the gauges until both read 0 (the engine drained: a client that left while nothing
    else was in flight is noticed only by the engine running it to its end) or the timeout."""
    deadline = time.monotonic() + timeout_s
    values: dict[str, float] = {}
    while True:
        try:
            values = gauges(await asyncio.to_thread(server.scrape_metrics))
        except httpx.HTTPError as exc:
            print(f"[soak] metrics scrape failed: {exc}", file=sys.stderr)
        if all(values.get(g) == 0 for g in GAUGES) or time.monotonic() > deadline:
            return values
        await asyncio.sleep(0.5)


# -- the load ----------------------------------------------------------------------------
@dataclass
class Report:
    minutes: float
    load_fraction: float
    capacity_req_per_s: float
    rate_req_per_s: float
    config: dict[str, Any]
    outcomes: list[Outcome] = field(default_factory=list)
    rss: list[tuple[float, int]] = field(default_factory=list)  # (s since start, worker RSS bytes)
    worker_pids: set[int] = field(default_factory=set)
    slots_after: dict[str, float] = field(default_factory=dict)
    wall_s: float = 0.0

    def counts(self) -> dict[str, Any]:
        valid = [o for o in self.outcomes if o.route != "invalid"]
        invalid = [o for o in self.outcomes if o.route == "invalid"]
        results = Counter(o.result for o in valid)
        return {
            "valid_sent": len(valid),
            "completed": results["completed"],
            "cancelled": results["cancelled"],
            "lost": results["lost"],
            "planned_disconnects": sum(o.planned_cut for o in valid),
            "invalid_sent": len(invalid),
            "invalid_refused_4xx_json": sum(o.result == "refused" for o in invalid),
            "invalid_answered_otherwise": sum(o.result == "accepted" for o in invalid),
            "by_route": {
                f"{route} {'stream' if stream else 'one-shot'}": sum(
                    o.route == route and o.stream == stream for o in valid
                )
                for route in ROUTES
                for stream in (True, False)
            },
            "lost_by_error": dict(Counter(o.error for o in valid if o.result == "lost")),
            "invalid_by_answer": dict(Counter(o.error for o in invalid)),
        }

    def rss_summary(self) -> dict[str, float | None]:
        mb = [v / 2**20 for _, v in self.rss]
        if not mb:
            return {"start_mb": None, "max_mb": None, "end_mb": None}
        return {"start_mb": round(mb[0], 1), "max_mb": round(max(mb), 1), "end_mb": round(mb[-1], 1)}

    def latency(self) -> dict[str, float]:
        done = [o for o in self.outcomes if o.result == "completed"]
        first = [o.first_chunk_s * 1000 for o in done if o.stream and o.first_chunk_s is not None]
        ends = [o.ended_s for o in done]
        return {
            "first_chunk_ms_p50": round(percentile(first, 50), 1),
            "first_chunk_ms_p99": round(percentile(first, 99), 1),
            "latency_s_p50": round(percentile(ends, 50), 3),
            "latency_s_p99": round(percentile(ends, 99), 3),
            "completion_tokens": sum(o.completion_tokens for o in done),
        }

    def leaked(self) -> bool:
        return any(self.slots_after.get(g) != 0 for g in GAUGES)

    def failed(self) -> bool:
        c = self.counts()
        return c["lost"] > 0 or c["invalid_answered_otherwise"] > 0 or self.leaked() or c["valid_sent"] == 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "minutes": self.minutes,
            "load_fraction": self.load_fraction,
            "capacity_req_per_s": self.capacity_req_per_s,
            "rate_req_per_s": self.rate_req_per_s,
            "counts": self.counts(),
            "latency": self.latency(),
            "worker_rss": self.rss_summary(),
            "worker_rss_samples_mb": [(round(t, 1), round(v / 2**20, 1)) for t, v in self.rss],
            "worker_pids": sorted(self.worker_pids),
            "slots_after_drain": self.slots_after,
            "passed": not self.failed(),
            "wall_s": round(self.wall_s, 1),
            "config": self.config,
            "requests": [asdict(o) for o in self.outcomes],
        }


async def drive(server: TorchServe, plans: list[Planned], report: Report, rss_every_s: float, timeout_s: float) -> None:
    """Send every planned request at its time, sample the worker's RSS, then let it drain."""
    url = server.predictions_url
    headers = {**server.headers, "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    pid = frontend_pid(server)
    start = time.perf_counter()
    done = asyncio.Event()

    async def sample() -> None:
        while True:
            rss = worker_rss(pid)
            report.worker_pids.update(rss)
            report.rss.append((time.perf_counter() - start, sum(rss.values())))
            if done.is_set():
                return
            try:
                await asyncio.wait_for(done.wait(), rss_every_s)
            except asyncio.TimeoutError:
                pass

    async def progress() -> None:
        while True:
            try:
                await asyncio.wait_for(done.wait(), 30)
                return
            except asyncio.TimeoutError:
                pass
            c = Counter(o.result for o in report.outcomes)
            rss = report.rss[-1][1] / 2**20 if report.rss else math.nan
            print(
                f"[soak] {time.perf_counter() - start:5.0f} s: {len(report.outcomes)} answered "
                f"({dict(c)}), worker RSS {rss:.0f} MB",
                file=sys.stderr,
            )

    sampler, reporter = asyncio.create_task(sample()), asyncio.create_task(progress())
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=30.0)) as client:

        async def one(planned: Planned) -> None:
            report.outcomes.append(await send(client, url, headers, planned))

        tasks = []
        for planned in plans:
            delay = start + planned.offset_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(planned)))
        await asyncio.gather(*tasks)
    report.slots_after = await settle(server, timeout_s=60)
    done.set()
    await asyncio.gather(sampler, reporter)
    report.outcomes.sort(key=lambda o: o.index)


def make_plans(minutes: float, rate: float, mix: Mix, prompts: PromptMaker, model: str, seed: int) -> list[Planned]:
    duration = minutes * 60
    offsets = [t for t in arrival_offsets("poisson", rate, math.ceil(rate * duration * 1.5) + 1, seed) if t < duration]
    rng = random.Random(seed + 1)
    return [plan_request(i, t, rng, prompts, mix, model) for i, t in enumerate(offsets)]


# -- output ------------------------------------------------------------------------------
def format_report(report: Report) -> str:
    c, rss, lat = report.counts(), report.rss_summary(), report.latency()
    rows = [
        ("duration", f"{report.minutes:g} min at {report.rate_req_per_s:.2f} req/s "
         f"({report.load_fraction:.0%} of capacity {report.capacity_req_per_s:.2f} req/s)"),
        ("valid requests sent", c["valid_sent"]),
        ("  completed (finish_reason)", c["completed"]),
        ("  cancelled by the client", f"{c['cancelled']} (of {c['planned_disconnects']} planned disconnects)"),
        ("  lost", c["lost"]),
        ("invalid requests sent", c["invalid_sent"]),
        ("  refused with 4xx JSON", c["invalid_refused_4xx_json"]),
        ("  answered otherwise", c["invalid_answered_otherwise"]),
        ("errors (lost) by type", json.dumps(c["lost_by_error"]) if c["lost_by_error"] else "none"),
        ("first chunk ms p50 / p99", f"{lat['first_chunk_ms_p50']} / {lat['first_chunk_ms_p99']} (streamed)"),
        ("latency s p50 / p99", f"{lat['latency_s_p50']} / {lat['latency_s_p99']}"),
        ("worker RSS MB start/max/end", f"{rss['start_mb']} / {rss['max_mb']} / {rss['end_mb']}"),
        ("worker pids", ", ".join(map(str, sorted(report.worker_pids))) or "none found"),
        ("after drain", ", ".join(f"{g} {report.slots_after.get(g, 'missing')}" for g in GAUGES)),
        ("result", "PASS" if not report.failed() else "FAIL"),
    ]  # fmt: skip
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--load-fraction", type=float, default=0.7, help="offered load, of capacity")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama", help="the tokenizer")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "soak")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "soak.json")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim: scales every simulated sleep (> 0)")
    parser.add_argument("--disconnect", type=float, default=Mix.disconnect, help="share of clients that leave")
    parser.add_argument("--invalid", type=float, default=Mix.invalid, help="share of invalid requests")
    parser.add_argument("--rss-every", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--request-timeout", type=float, default=120.0, help="a request silent this long is lost")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replicas", type=int, default=1, help="scheduler.replicas: model copies in the worker")
    args = parser.parse_args(argv)
    if args.time_scale <= 0 or args.minutes <= 0 or not 0 < args.load_fraction or args.replicas < 1:
        parser.error("--time-scale, --minutes, --load-fraction and --replicas must be > 0")

    started = time.monotonic()
    mix = Mix(disconnect=args.disconnect, invalid=args.invalid)
    model_dir = args.model_dir.resolve()
    config = sim_model_config(args.profile, args.time_scale)
    n_slots = config["scheduler"]["n_slots"]
    if args.replicas > 1:  # each replica its own simulated device: R times the capacity
        config["scheduler"]["replicas"] = args.replicas
        config.update(batchSize=2 * args.replicas * n_slots, jobQueueSize=4 * args.replicas * n_slots)
    budget = config["scheduler"].get("prefill_token_budget", des.DEFAULT_BUDGET)
    profile = des.scaled(load_profile(args.profile), args.time_scale)
    capacity = args.replicas * des.capacity(profile, mix.shape(), n_slots, budget)
    rate = args.load_fraction * capacity
    plans = make_plans(args.minutes, rate, mix, PromptMaker(model_dir, args.seed), "llama", args.seed)
    report = Report(args.minutes, args.load_fraction, capacity, rate, config)
    print(
        f"[soak] capacity {capacity:.2f} req/s (continuous policy, {args.replicas} x {n_slots} slots, mean prompt "
        f"{mix.prompt.mean} / "
        f"output {mix.output.mean} tokens); offering {rate:.2f} req/s for {args.minutes:g} min: {len(plans)} requests",
        file=sys.stderr,
    )
    server = bench_server.start(args.workdir.resolve(), model_dir, config)
    try:
        asyncio.run(drive(server, plans, report, args.rss_every, args.request_timeout))
    finally:
        server.stop()
    report.wall_s = time.monotonic() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report.to_dict(), indent=1))
    print(format_report(report))
    print(f"report: {args.out}")
    return 1 if report.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
