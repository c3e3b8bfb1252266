"""`make bench-isolation`: does one class of hostile requests slow or break the stream beside it?

The script starts its own torchserve (scripts/serve/local_torchserve.py via bench_server: free ports
on 127.0.0.1, token auth on) with the hf bench's model config (bench_suite.hf_model_config:
continuous mode, 4 slots, batchSize 8) on the tiny model, with responseTimeout 20 s instead of
120 (`--response-timeout`) so TorchServe gives up on a silent worker within the run's budget.

The bystander is a streamed OpenAI completion (`/predictions/<m>/1.0/v1/completions`, SSE) of
`--tokens` (300) tokens with ignore_eos; each chunk with text is timestamped and the ITL is the
gap between consecutive chunks. After a warm-up it streams `--repeats` (3) times alone, one
after the other (the gaps pooled: the baseline), then as many times per hostile class while
that class's requests arrive: from the first stream's first chunk until the last stream ends,
a few senders at a time with a pause between requests, within a count and `--class-timeout`:
  a  a lone surrogate in `model` (raw JSON `"\\ud800"`), chat and completions
  b  a lone surrogate in the prompt and in a chat message
  c  JSON nested 2,000 deep inside response_format's json_schema
  d  one 1,000,000-character stop string, max_tokens 3 (and with n 4)
  e  sixteen 60 KB stop strings
  f  a json_schema response_format with 12,000 optional string properties, 4 at once
The hostile client is a process of its own, so its work never delays the bystander's chunk
timestamps. Per class: the hostile requests' status codes and median time to answer, the
bystander's ITL p50 / p99 and the ratio of its p99 to the one alone (goal <= 2), and whether
the worker changed (its pids from the process table, and the `[PID]` lines a starting worker
writes to model_log.log). A class passes when the ratio is within the goal, every bystander
stream finished, the worker is the same and no hostile request got a 5xx or no answer. A
class that kills the worker is recorded (the bystander's streams stop there) and the next
waits for the restarted worker; one that leaves the worker serving nothing for
`--recover-timeout` s gets torchserve restarted.

    python -m scripts.bench.isolation                       # every class: 1-3 min on 2 cores
    python -m scripts.bench.isolation --classes a,d --out bench_results/bench-isolation-ad

Results: a table on stdout and `<out>.json` (default bench_results/bench-isolation.json), with
every class's gaps and the commit and uncommitted handler/ changes it ran on.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import re
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

from scripts.bench import server as bench_server
from scripts.bench.client import _parse_event
from scripts.bench.stats import percentile
from scripts.bench.suite import HF_BATCH, hf_model_config
from scripts.serve.local_torchserve import TorchServe

REPO = Path(__file__).resolve().parents[2]
GOAL = 2.0  # bystander ITL p99 with the hostile class / alone
PID_LINE = re.compile(r"\[PID\](\d+)")
BYSTANDER_PROMPT = "Today the weather is really nice and I am planning on a long walk along the river"
SURROGATE = "\ud800"
MODEL = "llama"  # bench_server's model name


# -- the hostile classes -------------------------------------------------------------------
@dataclass(frozen=True)
class Hostile:
    """One hostile request: its route (after /predictions/<model>) and raw body."""

    route: str
    body: bytes


@dataclass(frozen=True)
class HostileClass:
    """A class of hostile requests and how hard they are sent."""

    key: str
    name: str
    requests: tuple[Hostile, ...]  # sent in turn
    concurrency: int = 2  # senders at once
    max_requests: int = 24  # in all, for the class
    gap_s: float = 0.1  # each sender's pause between requests

    @property
    def bytes_each(self) -> int:
        return max((len(h.body) for h in self.requests), default=0)


COMPLETIONS, CHAT = "/1.0/v1/completions", "/1.0/v1/chat/completions"


def completion(model: str, **fields: Any) -> Hostile:
    """A non-streamed completion; json.dumps writes a lone surrogate as the escape `\\ud800`."""
    return Hostile(COMPLETIONS, json.dumps({"model": model, "prompt": "hi", "max_tokens": 4, **fields}).encode())


def chat(model: str, content: str = "hi", **fields: Any) -> Hostile:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}
    return Hostile(CHAT, json.dumps(body).encode())


def deep_schema_requests(model: str, depth: int) -> tuple[Hostile, ...]:
    """response_format whose schema nests `depth` objects (`items` in `items`), written by hand:
    json.dumps itself recurses."""
    schema = '{"type": "array", "items": ' * depth + '{"type": "string"}' + "}" * depth
    head = '{"type": "json_schema", "json_schema": {"name": "deep", "schema": '
    response_format = head + schema + "}}"
    out = []
    for hostile in (completion(model), chat(model)):
        raw = hostile.body.decode()
        out.append(Hostile(hostile.route, (raw[:-1] + ', "response_format": ' + response_format + "}").encode()))
    return tuple(out)


def wide_schema(properties: int) -> dict[str, Any]:
    props = {f"field_{i:05d}": {"type": "string"} for i in range(properties)}
    schema = {"type": "object", "properties": props}
    return {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}


def hostile_classes(model: str) -> list[HostileClass]:
    """Every class, its bodies built once (the big ones are about 1 MB each)."""
    huge_stop = "x" * 1_000_000
    stops = [chr(ord("a") + i) * 60_000 for i in range(16)]
    return [
        HostileClass("a", "surrogate in model", (completion(SURROGATE), chat(SURROGATE))),
        HostileClass(
            "b",
            "surrogate in prompt/message",
            (completion(model, prompt=f"hi {SURROGATE} there"), chat(model, f"hi {SURROGATE} there")),
        ),
        HostileClass("c", "schema nested 2,000 deep", deep_schema_requests(model, 2000)),
        HostileClass(
            "d",
            "1M-char stop, max_tokens 3 (n 1, 4)",
            (completion(model, max_tokens=3, stop=huge_stop), completion(model, max_tokens=3, n=4, stop=huge_stop)),
            max_requests=8,
            gap_s=0.2,
        ),
        HostileClass("e", "16 stop strings of 60 KB", (completion(model, stop=stops),), max_requests=8, gap_s=0.2),
        HostileClass(
            "f",
            "schema of 12,000 optional props (x4)",
            (chat(model, response_format=wide_schema(12_000), max_tokens=16),),
            concurrency=4,
            max_requests=8,
            gap_s=0.5,
        ),
    ]


# -- the hostile sender: its own process ---------------------------------------------------
# The hostile client runs in a process of its own, so its work (1 MB bodies, many responses)
# never delays the bystander's event loop and so its chunk timestamps: on a real deployment
# the two are different clients. The parent drives it through a pipe: ("run", class key, url,
# headers, timeout) at the bystander's first chunk, "stop" when the bystander's streams ended;
# it answers with its results once it has both stopped and heard "stop".
@dataclass
class HostileResult:
    route: str
    status: int  # 0: no status (the connection broke or timed out)
    seconds: float
    error: str | None = None


async def send_hostile(client: httpx.AsyncClient, url: str, headers: dict[str, str], hostile: Hostile) -> HostileResult:
    started = time.perf_counter()
    try:
        response = await client.post(url + hostile.route, content=hostile.body, headers=headers)
        error = None if response.status_code == 200 else response.text[:160]
        return HostileResult(hostile.route, response.status_code, time.perf_counter() - started, error)
    except httpx.HTTPError as exc:
        return HostileResult(hostile.route, 0, time.perf_counter() - started, f"{type(exc).__name__}: {exc}"[:160])


async def send_class(
    url: str, headers: dict[str, str], hostile: HostileClass, stopped: Callable[[], bool], timeout_s: float
) -> list[HostileResult]:
    """`hostile.concurrency` senders, each sending the class's requests in turn with a pause
    between them, until `stopped()`, `timeout_s` passed or the class's count is reached; every
    sender sends at least once."""
    results: list[HostileResult] = []
    numbers, deadline = itertools.count(), time.monotonic() + timeout_s
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=16)
    headers = {**headers, "Content-Type": "application/json"}

    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=10)) as client:

        async def sender() -> None:
            for n in numbers:
                late = stopped() or time.monotonic() > deadline
                if n >= hostile.max_requests or (n >= hostile.concurrency and late):
                    return
                results.append(await send_hostile(client, url, headers, hostile.requests[n % len(hostile.requests)]))
                await asyncio.sleep(hostile.gap_s)

        await asyncio.gather(*(sender() for _ in range(hostile.concurrency)))
    return results


def stop_flag(conn: Connection) -> Callable[[], bool]:
    """True once the parent's "stop" has arrived on `conn` (read then, without blocking)."""
    seen = [False]

    def stopped() -> bool:
        if not seen[0] and conn.poll():
            seen[0] = conn.recv() == "stop"
        return seen[0]

    return stopped


def sender_main(conn: Connection) -> None:
    """The hostile process: every class's bodies built once, then one class per "run" message."""
    classes = {c.key: c for c in hostile_classes(MODEL)}
    while (message := conn.recv()) is not None:
        _, key, url, headers, timeout_s = message
        stopped = stop_flag(conn)
        results = asyncio.run(send_class(url, headers, classes[key], stopped, timeout_s))
        while not stopped():
            conn.poll(None)
        conn.send([asdict(r) for r in results])


class HostileSender:
    """The parent's handle on the hostile process."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=sender_main, args=(child,), name="hostile-sender", daemon=True)
        self.process.start()

    def begin(self, key: str, server: TorchServe, timeout_s: float) -> None:
        self.conn.send(("run", key, server.predictions_url, server.headers, timeout_s))

    def end(self, timeout_s: float) -> list[HostileResult]:
        self.conn.send("stop")
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"the hostile sender gave no results within {timeout_s:.0f} s")
        return [HostileResult(**r) for r in self.conn.recv()]

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()


# -- the bystander -------------------------------------------------------------------------
@dataclass
class Stream:
    """One bystander stream's chunk times (time.perf_counter) and how it ended."""

    chunks: list[float] = field(default_factory=list)
    completion_tokens: int = 0  # from `usage`; 0 when the stream did not end
    outcome: str = "finish"  # finish | error | broken | stalled
    error: str | None = None
    gave_up: float | None = None  # a stall: when the client stopped waiting

    @property
    def gaps_ms(self) -> list[float]:
        """The gaps between chunks, and a stall's from the last chunk to giving up."""
        times = self.chunks + ([self.gave_up] if self.gave_up is not None and self.chunks else [])
        return [(b - a) * 1000 for a, b in itertools.pairwise(times)]

    @property
    def tokens(self) -> int:
        return self.completion_tokens or len(self.chunks)


def bystander_body(model: str, tokens: int) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": BYSTANDER_PROMPT,
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def read_stream(server: TorchServe, tokens: int, stream: Stream, first: Callable[[], None]) -> None:
    """Stream the bystander into `stream`, calling `first` at its first text chunk."""
    url, body = f"{server.predictions_url}{COMPLETIONS}", bystander_body(server.model_name, tokens)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client:
        async with client.stream("POST", url, json=body, headers=server.headers) as r:
            if r.status_code != 200:
                stream.outcome, stream.error = "error", f"HTTP {r.status_code}: {(await r.aread())[:160]!r}"
                return
            async for line in r.aiter_lines():
                if not line.strip():
                    continue
                text, usage, _, error = _parse_event("openai", line)
                if text:
                    stream.chunks.append(time.perf_counter())
                    if len(stream.chunks) == 1:
                        first()
                if usage:
                    stream.completion_tokens = int(usage.get("completion_tokens", 0))
                if error:
                    stream.outcome, stream.error = "error", error


async def bystander(server: TorchServe, tokens: int, timeout_s: float, first: Callable[[], None]) -> Stream:
    """One bystander stream, ended by the server, a broken connection or `timeout_s` (a stall:
    the time from its last chunk to the timeout counts as one more gap)."""
    stream = Stream()
    try:
        await asyncio.wait_for(read_stream(server, tokens, stream, first), timeout_s)
    except asyncio.TimeoutError:
        stream.outcome, stream.error = "stalled", f"not ended after {timeout_s:.0f} s"
        stream.gave_up = time.perf_counter()
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        stream.outcome, stream.error = "broken", f"{type(exc).__name__}: {exc}"[:160]
    if not stream.chunks:
        first()  # it never streamed: the hostile requests are sent all the same
    return stream


async def bystanders(server: TorchServe, args: argparse.Namespace, first: Callable[[], None]) -> list[Stream]:
    """`--repeats` bystander streams, one after the other, `first` called at the first one's
    first chunk; the rest are skipped once one did not finish (the worker died or stalled)."""
    streams: list[Stream] = []
    for _ in range(args.repeats):
        streams.append(await bystander(server, args.tokens, args.class_timeout, first if not streams else _nothing))
        if streams[-1].outcome != "finish":
            break
    return streams


def _nothing() -> None:
    pass


# -- one class -----------------------------------------------------------------------------
@dataclass
class ClassResult:
    key: str
    name: str
    body_bytes: int
    statuses: dict[str, int]
    answer_p50_s: float
    itl_p50_ms: float
    itl_p99_ms: float
    ratio: float
    bystander: str  # the bystander streams' outcomes (the first that did not finish, with its error)
    bystander_streams: int
    bystander_tokens: int
    worker_before: list[int]
    worker_after: list[int]
    worker_starts: list[int]  # pids of the workers that started during the class ([PID] lines)
    recovered_s: float | None  # until a request was served again after the class; None: torchserve restarted
    hostile_errors: list[str]
    gaps_ms: list[float] = field(repr=False, default_factory=list)

    @property
    def worker_changed(self) -> bool:
        return bool(self.worker_starts) or self.worker_before != self.worker_after

    @property
    def hostile_failed(self) -> int:
        """Hostile requests answered 5xx or not at all (a bad request's answer is its own 4xx)."""
        return sum(count for status, count in self.statuses.items() if int(status) == 0 or int(status) >= 500)

    @property
    def passed(self) -> bool:
        """The ratio within the goal, every bystander stream finished, the same worker, no 5xx."""
        isolated = self.bystander == "finish" and not self.worker_changed and not self.hostile_failed
        return self.ratio <= GOAL and isolated


def itl(gaps_ms: list[float]) -> tuple[float, float]:
    return percentile(gaps_ms, 50), percentile(gaps_ms, 99)


def worker_starts(server: TorchServe, offset: int) -> list[int]:
    """Pids TorchServe's workers logged as started (`[PID]n`) after character `offset` of model_log.log."""
    return [int(pid) for pid in PID_LINE.findall(server.log_text()[offset:])]


def outcome_text(streams: list[Stream]) -> str:
    bad = next((s for s in streams if s.outcome != "finish"), None)
    return "finish" if bad is None else f"{bad.outcome} ({bad.error})"


def class_result(
    hostile: HostileClass,
    streams: list[Stream],
    results: list[HostileResult],
    alone_p99: float,
    workers: tuple[list[int], list[int], list[int]],
    recovered: float | None,
) -> ClassResult:
    """One row: `workers` is (pids before, pids after, pids logged as started meanwhile)."""
    gaps = [gap for s in streams for gap in s.gaps_ms]
    p50, p99 = itl(gaps)
    return ClassResult(
        key=hostile.key,
        name=hostile.name,
        body_bytes=hostile.bytes_each,
        statuses=dict(sorted(Counter(str(r.status) for r in results).items())),
        answer_p50_s=statistics.median(r.seconds for r in results) if results else math.nan,
        itl_p50_ms=p50,
        itl_p99_ms=p99,
        ratio=p99 / alone_p99 if alone_p99 > 0 else math.nan,
        bystander=outcome_text(streams),
        bystander_streams=len(streams),
        bystander_tokens=sum(s.tokens for s in streams),
        worker_before=workers[0],
        worker_after=workers[1],
        worker_starts=workers[2],
        recovered_s=recovered,
        hostile_errors=sorted({" ".join(r.error.split()) for r in results if r.error})[:4],
        gaps_ms=gaps,
    )


def run_class(bench: Bench, hostile: HostileClass) -> ClassResult:
    """The bystander streams with the class's requests arriving from its first chunk on; then
    the wait for a served request (torchserve restarted when none comes)."""
    server, args = bench.server, bench.args
    before, offset = sorted(server.worker_pids()), len(server.log_text())
    print(f"[isolation] {hostile.key}: {hostile.name} ({hostile.bytes_each:,} bytes each) ...", file=sys.stderr)
    streams = asyncio.run(bystanders(server, args, lambda: bench.sender.begin(hostile.key, server, args.class_timeout)))
    results = bench.sender.end(args.class_timeout + 15)
    recovered = wait_served(server, args.recover_timeout)
    starts = worker_starts(server, offset)
    if recovered is None:
        bench.restart(f"class {hostile.key} left the worker unable to serve")
    workers = (before, sorted(bench.server.worker_pids()), starts)
    return class_result(hostile, streams, results, bench.alone_p99, workers, recovered)


def wait_served(server: TorchServe, timeout_s: float) -> float | None:
    """Seconds until a one-token request is answered 200 (the worker, or its replacement,
    serves); None when none is within `timeout_s`."""
    started = time.monotonic()
    body = {"prompt": "are you there", "max_new_tokens": 1, "stream": False}
    while time.monotonic() - started < timeout_s:
        try:
            response = httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=timeout_s)
            if response.status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return None


# -- the run -------------------------------------------------------------------------------
@dataclass
class Bench:
    """The server under test (replaced when a class leaves it unable to serve), the hostile
    sender and the baseline."""

    args: argparse.Namespace
    config: dict[str, Any]
    server: TorchServe
    sender: HostileSender
    alone_p99: float = math.nan
    restarts: list[str] = field(default_factory=list)

    def restart(self, why: str) -> None:
        print(f"[isolation] {why}: restarting torchserve", file=sys.stderr)
        self.restarts.append(why)
        self.server.stop()
        self.server = start_server(self.args, self.config)


def model_config(args: argparse.Namespace) -> dict[str, Any]:
    """The hf bench's continuous config at 4 slots; a short responseTimeout (see the docstring)."""
    config = hf_model_config(HF_BATCH)
    config["responseTimeout"] = args.response_timeout
    return config


def start_server(args: argparse.Namespace, config: dict[str, Any]) -> TorchServe:
    print(f"[isolation] starting torchserve in {args.workdir} ...", file=sys.stderr)
    return bench_server.start(args.workdir, args.model_dir.resolve(), config)


def run_alone(bench: Bench) -> ClassResult:
    """A warm-up stream, then `--repeats` streams alone: their gaps together are the baseline."""
    args = bench.args
    asyncio.run(bystander(bench.server, args.tokens, args.class_timeout, _nothing))
    streams = asyncio.run(bystanders(bench.server, args, _nothing))
    bench.alone_p99 = itl([gap for s in streams for gap in s.gaps_ms])[1]
    pids = sorted(bench.server.worker_pids())
    return class_result(HostileClass("-", "alone", ()), streams, [], bench.alone_p99, (pids, pids, []), 0.0)


def run_all(bench: Bench, classes: list[HostileClass]) -> list[ClassResult]:
    results = [run_alone(bench)]
    print_class(results[0])
    for hostile in classes:
        results.append(run_class(bench, hostile))
        print_class(results[-1])
    return results


# -- output --------------------------------------------------------------------------------
def statuses_text(statuses: dict[str, int]) -> str:
    """`400x12,500x2`; `none` counts requests that got no status (timed out, connection broken)."""
    return ",".join(f"{'none' if code == '0' else code}x{count}" for code, count in statuses.items()) or "-"


def worker_text(result: ClassResult) -> str:
    pids = ",".join(map(str, result.worker_after))
    if result.recovered_s is None:
        return f"WEDGED: torchserve restarted (now {pids})"
    if result.worker_changed:
        return f"DIED: {','.join(map(str, result.worker_before))} -> {pids} (serving after {result.recovered_s:.1f} s)"
    return f"same {pids}"


def print_class(result: ClassResult) -> None:
    print(
        f"[isolation] {result.key} {result.name}: hostile {statuses_text(result.statuses)}, answered in "
        f"{result.answer_p50_s:.3f} s (median); bystander {result.bystander}, {result.bystander_streams} streams, "
        f"{result.bystander_tokens} tokens, "
        f"ITL p50 {result.itl_p50_ms:.2f} ms, p99 {result.itl_p99_ms:.2f} ms, ratio {result.ratio:.2f}; "
        f"worker {worker_text(result)}",
        file=sys.stderr,
    )
    for error in result.hostile_errors:
        print(f"    hostile error: {error}", file=sys.stderr)


def format_table(results: list[ClassResult]) -> str:
    header = (
        f"{'class':<40} {'hostile status':>16} {'answer p50 s':>12} {'ITL p50 ms':>10} {'ITL p99 ms':>10} "
        f"{'p99/alone':>9} {'goal':>4}  {'bystander':<10} worker"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        goal = "-" if r.key == "-" else ("ok" if r.passed else "MISS")
        answer = "-" if math.isnan(r.answer_p50_s) else f"{r.answer_p50_s:.3f}"
        lines.append(
            f"{f'{r.key} {r.name}':<40} {statuses_text(r.statuses):>16} {answer:>12} {r.itl_p50_ms:>10.2f} "
            f"{r.itl_p99_ms:>10.2f} {r.ratio:>9.2f} {goal:>4}  {r.bystander.split(' ')[0]:<10} {worker_text(r)}"
        )
    return "\n".join(lines)


def git_state() -> dict[str, Any]:
    """The commit and whether handler/ has uncommitted changes: which side of a fix was measured."""

    def git(*cmd: str) -> str:
        done = subprocess.run(["git", *cmd], cwd=REPO, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD"), "handler_changes": git("status", "--porcelain", "handler").splitlines()}


def host_load(start: tuple[float, ...]) -> dict[str, Any]:
    """The 1-minute load average at the start and the end, and the CPUs: other work on the
    host (a second server, a test run) shows in the ITLs."""
    return {"cpus": os.cpu_count(), "load_1m_start": round(start[0], 2), "load_1m_end": round(os.getloadavg()[0], 2)}


def write_results(path: Path, bench: Bench, results: list[ClassResult], meta: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        **meta,
        "goal": f"bystander ITL p99 with hostile requests / alone <= {GOAL}",
        "tokens": bench.args.tokens,
        "n_slots": HF_BATCH,
        "model_dir": str(bench.args.model_dir),
        "model_config": bench.config,
        "restarts": bench.restarts,
    }
    rows = [asdict(r) | {"worker_changed": r.worker_changed, "passed": r.passed} for r in results]
    path.write_text(json.dumps({"meta": meta, "classes": rows}, indent=1))
    return path


# -- main ----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-isolation")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "bench-isolation", help="result stem")
    parser.add_argument("--classes", default="a,b,c,d,e,f", help="comma-separated class letters")
    parser.add_argument("--tokens", type=int, default=300, help="the bystander's completion tokens")
    parser.add_argument("--repeats", type=int, default=3, help="bystander streams per class (and alone), pooled")
    parser.add_argument("--class-timeout", type=float, default=20.0, help="s: bystander and hostile bound")
    parser.add_argument("--recover-timeout", type=float, default=30.0, help="s to wait for a served request after")
    parser.add_argument("--response-timeout", type=int, default=20, help="TorchServe's responseTimeout (s)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.tokens < 2:
        parser.error("--repeats must be at least 1 and --tokens at least 2")
    return args


def selected(classes: list[HostileClass], keys: str) -> list[HostileClass]:
    wanted = [k.strip() for k in keys.split(",") if k.strip()]
    unknown = set(wanted) - {c.key for c in classes}
    if unknown:
        raise SystemExit(f"unknown classes {sorted(unknown)}: choose from {[c.key for c in classes]}")
    return [c for c in classes if c.key in wanted]


def with_server(args: argparse.Namespace, body: Callable[[Bench], list[ClassResult]]) -> tuple[Bench, list]:
    """`body` on a started torchserve and hostile sender, both stopped after it."""
    config, sender = model_config(args), HostileSender()  # the sender imports while torchserve starts
    try:
        bench = Bench(args, config, start_server(args, config), sender)
        try:
            return bench, body(bench)
        finally:
            bench.server.stop()
    finally:
        sender.close()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started, load_start, git = time.monotonic(), os.getloadavg(), git_state()  # the code the archive gets
    classes = selected(hostile_classes(MODEL), args.classes)
    bench, results = with_server(args, lambda b: run_all(b, classes))
    meta = {"seconds": round(time.monotonic() - started, 1), "host": host_load(load_start), "git": git}
    path = write_results(args.out.with_suffix(".json"), bench, results, meta)
    print(format_table(results))
    host = meta["host"]
    print(
        f"goal: ITL p99 / alone <= {GOAL}; {meta['seconds']:.0f} s; load average {host['load_1m_start']} -> "
        f"{host['load_1m_end']} on {host['cpus']} CPUs; results: {path}"
    )


if __name__ == "__main__":
    main()
