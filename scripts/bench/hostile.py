"""`make bench-hostile`: the next request under hostile load (issue 42), on TorchServe and on the
ASGI frontend, each serving the default model on CPU with model-config.yaml (or `--model-config`).

1. Abandoned requests. `--abandoned` (200) OpenAI completions (`max_tokens` 200, `ignore_eos`, half
   streamed, half not), each written whole on its own TCP socket, which is closed right after; then
   `--settle-s` (10) of quiet, the slot gauges (llm_slots_occupied, llm_requests_waiting) and one
   normal streamed completion of 16 tokens: its TTFT and total time beside the same request's on
   the idle server before the flood (median of `--alone-repeats`).
2. A bystander beside huge schemas. One streamed chat completion of 64 tokens (`ignore_eos`), alone
   (median of `--alone-repeats`), then while `--schema-clients` (4) clients each send chat requests
   with a distinct `--schema-bytes` (0.9 MB) json_schema response_format (50 properties with ~18 KB
   descriptions), a new one as soon as the last is answered, whatever the status: its total time and
   largest gap between content chunks, both ratios to alone, and the schema requests' statuses
   answered during its run. The schema clients run in a process of their own, so building and
   sending their bodies never delays the bystander's chunk timestamps.

    .venv/bin/python -m scripts.bench.hostile --frontend both --out bench_results/bench-hostile.json
    .venv/bin/python -m scripts.bench.hostile --frontend asgi --abandoned 20 --settle-s 3 --only abandoned

A measurement, not a test: it prints what one run saw (timings on a shared host vary) and decides nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import multiprocessing
import os
import queue
import random
import socket
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import httpx
import yaml

from scripts.bench import server as bench_server
from scripts.bench.frontend_admission import summed
from scripts.serve.local_asgi import start_asgi_frontend

REPO = Path(__file__).resolve().parents[2]
FRONTENDS = ("torchserve", "asgi")
MEASUREMENTS = ("abandoned", "schema")
MODEL = "llama"  # the model name both launchers serve
PROMPT = "Today the weather is really nice and I am planning on a long walk along the river"
FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor incididunt "
SLOT_GAUGES = ("llm_slots_occupied", "llm_requests_waiting")
COUNTERS = ("llm_cancelled_requests", "llm_rejected_requests")
START_TIMEOUT_S = 300


# -- what is sent ----------------------------------------------------------------------------
def route(frontend: str, name: str, model: str = MODEL) -> str:
    """The path of an OpenAI route (`completions`, `chat/completions`) on `frontend`."""
    return f"/predictions/{model}/1.0/v1/{name}" if frontend == "torchserve" else f"/v1/{name}"


def completion_body(max_tokens: int, stream: bool, model: str = MODEL) -> dict[str, Any]:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    return body | ({"stream_options": {"include_usage": True}} if stream else {})


def chat_body(content: str, max_tokens: int, stream: bool, model: str = MODEL, **extra: Any) -> dict[str, Any]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens}
    body |= {"stream": stream, **extra}
    return body | ({"stream_options": {"include_usage": True}} if stream else {})


def wide_schema(tag: str, schema_bytes: int, properties: int = 50) -> dict[str, Any]:
    """An object schema of `properties` strings whose descriptions (ASCII, `tag` at both ends, so
    no two tags give the same text) bring its JSON to about `schema_bytes` (within `properties` bytes)."""
    names = [f"field_{i:02d}" for i in range(properties)]

    def schema(descriptions: dict[str, str]) -> dict[str, Any]:
        props = {n: {"type": "string", "description": descriptions.get(n, "")} for n in names}
        return {"type": "object", "properties": props, "required": names[:2]}

    each = max(0, (schema_bytes - len(json.dumps(schema({})))) // properties)
    descriptions = {}
    for name in names:
        head = f"{tag} {name} "
        middle = max(0, each - 2 * len(head))
        descriptions[name] = (head + (FILLER * (middle // len(FILLER) + 1))[:middle] + head)[:each]
    return schema(descriptions)


def schema_request(tag: str, schema_bytes: int, max_tokens: int, model: str = MODEL) -> bytes:
    """A non-streamed chat completion whose response_format is `wide_schema(tag, schema_bytes)`."""
    json_schema = {"name": f"record_{tag}", "schema": wide_schema(tag, schema_bytes)}
    fmt = {"type": "json_schema", "json_schema": json_schema}
    return json.dumps(chat_body("Describe one record.", max_tokens, False, model, response_format=fmt)).encode()


def raw_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    """One whole HTTP/1.1 POST, as written on a socket."""
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json"]
    lines += [f"Content-Length: {len(body)}", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
    return "\r\n".join(lines).encode("latin-1") + body


# -- what the client saw ---------------------------------------------------------------------
def chunk_content(line: str) -> tuple[str, dict[str, Any] | None]:
    """(generated text, usage) of one SSE line of a completion or chat completion stream."""
    if not line.startswith("data:") or (payload := line[5:].strip()) == "[DONE]":
        return "", None
    obj = json.loads(payload)
    choice = (obj.get("choices") or [{}])[0]
    text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
    return text, obj.get("usage")


@dataclass
class Stream:
    """One streamed request as the client saw it (time.monotonic: the same clock in every process)."""

    started: float
    ended: float = math.nan
    status: int = 0  # 0: no answer (connection failed, timed out)
    chunks: list[float] = field(default_factory=list)  # when each chunk with content arrived
    tokens: int = 0  # completion tokens from `usage`
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.chunks[0] - self.started if self.chunks else None

    @property
    def total_s(self) -> float:
        return self.ended - self.started

    @property
    def max_gap_s(self) -> float | None:
        """The largest gap between two content chunks."""
        return max_gap(self.chunks)

    def figures(self) -> dict[str, Any]:
        keys = ("status", "tokens", "error")
        return {"ttft_s": self.ttft_s, "total_s": self.total_s, "max_gap_s": self.max_gap_s} | {
            k: getattr(self, k) for k in keys
        }


def max_gap(times: list[float]) -> float | None:
    return max((b - a for a, b in itertools.pairwise(times)), default=None)


def ratio(beside: float | None, alone: float | None) -> float | None:
    return beside / alone if beside is not None and alone else None


def median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


@dataclass
class Answer:
    """One schema request: when it was sent and answered (time.monotonic) and its status."""

    sent: float
    answered: float
    status: int  # 0: no answer
    error: str | None = None


def statuses(answers: Iterable[Answer], start: float = -math.inf, end: float = math.inf) -> dict[str, int]:
    """How many of `answers` answered within [start, end] got each status ("none": no answer)."""
    counts = Counter(str(a.status or "none") for a in answers if start <= a.answered <= end)
    return dict(sorted(counts.items()))


def statuses_text(counts: dict[str, int]) -> str:
    return ",".join(f"{code}x{n}" for code, n in counts.items()) or "-"


# -- the servers -----------------------------------------------------------------------------
def start_server(frontend: str, workdir: Path, model_dir: Path, config: dict[str, Any]) -> Any:
    """TorchServe (its archive built from `config`) or the ASGI frontend, as frontends.py starts them."""
    print(f"[hostile] {frontend}: starting it in {workdir} ...", file=sys.stderr)
    if frontend == "asgi":
        return start_asgi_frontend(workdir, model_dir, config)
    return bench_server.start(workdir, model_dir, config, timeout=START_TIMEOUT_S)


def metric_values(server: Any) -> dict[str, float]:
    """The slot gauges and the cancelled / rejected counters, summed over labels; {} when unreadable."""
    try:
        text = server.scrape_metrics()
    except (httpx.HTTPError, OSError) as exc:
        print(f"[hostile] could not scrape metrics: {exc}", file=sys.stderr)
        return {}
    values = {name: summed(text, name) for name in SLOT_GAUGES}
    return values | {name: float(summed(text, name) + summed(text, f"{name}_total")) for name in COUNTERS}


def wait_idle(server: Any, timeout_s: float) -> float:
    """Seconds until the slot gauges read 0 on two scrapes in a row (a flood's leftovers done), at
    most `timeout_s`. TorchServe's own queue is not in them: the alone figures show what is left."""
    started, zero_before = time.monotonic(), False
    while time.monotonic() - started < timeout_s:
        values = metric_values(server)
        zero = bool(values) and all(values[g] == 0 for g in SLOT_GAUGES)
        if zero and zero_before:
            break
        zero_before = zero
        time.sleep(1.0)
    else:
        print(f"[hostile] the slot gauges did not read 0 within {timeout_s:.0f} s: going on", file=sys.stderr)
    return time.monotonic() - started


# -- one streamed request --------------------------------------------------------------------
async def _read(url: str, headers: dict[str, str], body: dict[str, Any], stream: Stream) -> None:
    async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            stream.status = r.status_code
            if r.status_code != 200:
                stream.error = (await r.aread())[:200].decode(errors="replace")
                return
            async for line in r.aiter_lines():
                text, usage = chunk_content(line)
                if text:
                    stream.chunks.append(time.monotonic())
                if usage:
                    stream.tokens = int(usage.get("completion_tokens", 0))


def stream_once(url: str, headers: dict[str, str], body: dict[str, Any], timeout_s: float) -> Stream:
    stream = Stream(time.monotonic())
    try:
        asyncio.run(asyncio.wait_for(_read(url, headers, body, stream), timeout_s))
    except (TimeoutError, asyncio.TimeoutError):
        stream.error = f"not ended after {timeout_s:.0f} s"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        stream.error = f"{type(exc).__name__}: {exc}"[:200]
    stream.ended = time.monotonic()
    return stream


def alone(url: str, headers: dict[str, str], body: dict[str, Any], repeats: int, timeout_s: float) -> dict[str, Any]:
    """A warm-up, then `repeats` requests one after the other: the medians of their figures."""
    stream_once(url, headers, body, timeout_s)
    runs = [stream_once(url, headers, body, timeout_s) for _ in range(repeats)]
    return {
        "ttft_s": median(s.ttft_s for s in runs),
        "total_s": median(s.total_s for s in runs),
        "max_gap_s": median(s.max_gap_s for s in runs),
        "statuses": statuses(Answer(s.started, s.ended, s.status) for s in runs),
    }


# -- 1. abandoned requests -------------------------------------------------------------------
def abandon(host: str, port: int, requests: list[bytes]) -> dict[str, Any]:
    """Each request written whole on a socket of its own, closed right after: the client never reads."""
    failed, started = [], time.monotonic()
    for request in requests:
        try:
            with socket.create_connection((host, port), timeout=10) as sock:
                sock.sendall(request)
        except OSError as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
    return {
        "sent": len(requests) - len(failed),
        "failed": len(failed),
        "errors": sorted(set(failed))[:4],
        "seconds": time.monotonic() - started,
    }


def measure_abandoned(server: Any, frontend: str, args: argparse.Namespace) -> dict[str, Any]:
    path, headers = route(frontend, "completions"), dict(server.headers)
    probe = completion_body(args.probe_tokens, stream=True)
    url = server.url + path
    idle = alone(url, headers, probe, args.alone_repeats, args.timeout_s)
    bodies = [
        json.dumps(completion_body(args.abandoned_tokens, stream=i % 2 == 0)).encode() for i in range(args.abandoned)
    ]
    host, port = "127.0.0.1", server.inference_port
    before = metric_values(server)
    print(f"[hostile] {frontend}: {args.abandoned} abandoned requests ...", file=sys.stderr)
    flood = abandon(host, port, [raw_request(host, port, path, headers, body) for body in bodies])
    just_after = metric_values(server)
    time.sleep(args.settle_s)
    settled = metric_values(server)
    after = stream_once(url, headers, probe, args.timeout_s)
    return {
        "alone": idle,
        "flood": flood,
        "metrics": {"before": before, "after_flood": just_after, "after_settle": settled},
        "after": after.figures(),
        "ttft_ratio": ratio(after.ttft_s, idle["ttft_s"]),
        "total_ratio": ratio(after.total_s if after.status == 200 else None, idle["total_s"]),
    }


# -- 2. the bystander beside huge schemas ----------------------------------------------------
def schema_sender(
    url: str, headers: dict[str, str], args: dict[str, Any], running: Event, stop: Event, results: Any
) -> None:
    """The schema clients' process: `args["clients"]` loops until `stop`; its answers put on `results`."""
    answers = asyncio.run(_send_schemas(url, headers, args, running, stop))
    results.put([asdict(a) for a in answers])


async def _send_schemas(
    url: str, headers: dict[str, str], args: dict[str, Any], running: Event, stop: Event
) -> list[Answer]:
    answers: list[Answer] = []
    rng = random.Random(args["seed"])
    headers = {**headers, "Content-Type": "application/json"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=args["clients"])
    async with httpx.AsyncClient(timeout=httpx.Timeout(args["timeout_s"], connect=10), limits=limits) as client:

        async def one_client(number: int) -> None:
            for n in itertools.count():
                if stop.is_set():
                    return
                tag = f"c{number}n{n}x{rng.getrandbits(48):012x}"  # distinct per request: nothing cached helps
                body = schema_request(tag, args["schema_bytes"], args["max_tokens"])
                sent = time.monotonic()
                running.set()
                try:
                    r = await client.post(url, content=body, headers=headers)
                    error = None if r.status_code == 200 else r.text[:200]
                    answers.append(Answer(sent, time.monotonic(), r.status_code, error))
                except httpx.HTTPError as exc:
                    answers.append(Answer(sent, time.monotonic(), 0, f"{type(exc).__name__}: {exc}"[:200]))

        tasks = [asyncio.create_task(one_client(i)) for i in range(args["clients"])]
        while not stop.is_set():
            await asyncio.sleep(0.05)
        _, pending = await asyncio.wait(tasks, timeout=args["grace_s"])  # the ones in flight answered
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    return answers


def measure_schema(server: Any, frontend: str, args: argparse.Namespace) -> dict[str, Any]:
    url, headers = server.url + route(frontend, "chat/completions"), dict(server.headers)
    bystander = chat_body(PROMPT, args.bystander_tokens, True, ignore_eos=True)
    idle = alone(url, headers, bystander, args.alone_repeats, args.timeout_s)
    context = multiprocessing.get_context("spawn")
    running, stop, results = context.Event(), context.Event(), context.Queue()
    sender_args = {
        "clients": args.schema_clients,
        "schema_bytes": args.schema_bytes,
        "seed": args.seed,
        "max_tokens": args.schema_max_tokens,
        "timeout_s": args.timeout_s,
        "grace_s": args.grace_s,
    }
    sender = context.Process(
        target=schema_sender, args=(url, headers, sender_args, running, stop, results), daemon=True
    )
    print(f"[hostile] {frontend}: bystander beside {args.schema_clients} schema clients ...", file=sys.stderr)
    sender.start()
    answers: list[Answer] = []
    try:
        if not running.wait(60):
            raise RuntimeError("the schema clients did not start within 60 s")
        time.sleep(args.schema_lead_s)  # their first requests reach the server before the bystander
        beside = stream_once(url, headers, bystander, args.timeout_s)
    finally:
        stop.set()
        try:
            answers = [Answer(**a) for a in results.get(timeout=args.grace_s + 30)]
        except queue.Empty:
            print("[hostile] the schema clients sent no results", file=sys.stderr)
        finally:
            sender.join(10)
            if sender.is_alive():
                sender.kill()
    body_bytes = len(schema_request("x" * 16, args.schema_bytes, args.schema_max_tokens))
    return {
        "alone": idle,
        "beside": beside.figures(),
        "total_ratio": ratio(beside.total_s if beside.status == 200 else None, idle["total_s"]),
        "max_gap_ratio": ratio(beside.max_gap_s, idle["max_gap_s"]),
        "schema_body_bytes": body_bytes,
        "schema_statuses_during": statuses(answers, beside.started, beside.ended),
        "schema_statuses_all": statuses(answers),
        "schema_answer_median_s": median(a.answered - a.sent for a in answers),
        "schema_errors": sorted({" ".join(a.error.split())[:160] for a in answers if a.error})[:4],
    }


# -- one frontend ----------------------------------------------------------------------------
def run_frontend(frontend: str, args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    server = start_server(frontend, args.workdir / frontend, args.model_dir, config)
    out: dict[str, Any] = {}
    try:
        if "abandoned" in args.measurements:
            out["abandoned"] = measure_abandoned(server, frontend, args)
        if "schema" in args.measurements:
            if out:
                out["idle_after_s"] = wait_idle(server, args.idle_timeout_s)
            out["schema"] = measure_schema(server, frontend, args)
    finally:
        server.stop()
    return out


# -- output ----------------------------------------------------------------------------------
def ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.0f}"


def times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def rows(results: dict[str, dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The table's rows: a label, one cell per frontend."""

    def row(label: str, cell: Any) -> tuple[str, list[str]]:
        return label, [cell(r) for r in results.values()]

    out = []
    if any("abandoned" in r for r in results.values()):

        def ab(r: dict[str, Any]) -> dict[str, Any]:
            return r.get("abandoned") or {"alone": {}, "after": {}, "flood": {}, "metrics": {"after_settle": {}}}

        def slots(r: dict[str, Any]) -> str:
            m = ab(r)["metrics"]["after_settle"]
            return "/".join(f"{m[g]:.0f}" if g in m else "-" for g in SLOT_GAUGES)

        def counted(r: dict[str, Any]) -> str:
            m = ab(r)["metrics"]
            before, after = m.get("before", {}), m["after_settle"]
            return "/".join(f"{after[c] - before[c]:.0f}" if c in after and c in before else "-" for c in COUNTERS)

        out += [
            row(
                "abandoned: sent (failed)",
                lambda r: f"{ab(r)['flood'].get('sent', '-')} ({ab(r)['flood'].get('failed', '-')})",
            ),
            row("  cancelled/rejected, settled", counted),
            row("  slots occupied/waiting, settled", slots),
            row("  TTFT alone ms", lambda r: ms(ab(r)["alone"].get("ttft_s"))),
            row("  TTFT after ms", lambda r: ms(ab(r)["after"].get("ttft_s"))),
            row("  TTFT after/alone", lambda r: times(ab(r).get("ttft_ratio"))),
            row("  total alone ms", lambda r: ms(ab(r)["alone"].get("total_s"))),
            row(
                "  total after ms (status)",
                lambda r: f"{ms(ab(r)['after'].get('total_s'))} ({ab(r)['after'].get('status', '-')})",
            ),
        ]
    if any("schema" in r for r in results.values()):

        def sc(r: dict[str, Any]) -> dict[str, Any]:
            return r.get("schema") or {"alone": {}, "beside": {}}

        out += [
            row("schema: bystander total alone ms", lambda r: ms(sc(r)["alone"].get("total_s"))),
            row(
                "  total beside ms (status)",
                lambda r: f"{ms(sc(r)['beside'].get('total_s'))} ({sc(r)['beside'].get('status', '-')})",
            ),
            row("  total beside/alone", lambda r: times(sc(r).get("total_ratio"))),
            row("  largest gap alone ms", lambda r: ms(sc(r)["alone"].get("max_gap_s"))),
            row("  largest gap beside ms", lambda r: ms(sc(r)["beside"].get("max_gap_s"))),
            row("  largest gap beside/alone", lambda r: times(sc(r).get("max_gap_ratio"))),
            row("  schema statuses during", lambda r: statuses_text(sc(r).get("schema_statuses_during", {}))),
            row("  schema statuses in all", lambda r: statuses_text(sc(r).get("schema_statuses_all", {}))),
        ]
    return out


def format_table(names: list[str], table: list[tuple[str, list[str]]]) -> str:
    width = max([len(label) for label, _ in table] + [10]) + 2
    columns = [max([len(n)] + [len(cells[i]) for _, cells in table]) + 2 for i, n in enumerate(names)]
    lines = [" " * width + "".join(f"{n:>{w}}" for n, w in zip(names, columns, strict=True))]
    lines += [
        f"{label:<{width}}" + "".join(f"{c:>{w}}" for c, w in zip(cells, columns, strict=True))
        for label, cells in table
    ]
    return "\n".join(lines)


# -- main ------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frontend", choices=(*FRONTENDS, "both"), default="both")
    parser.add_argument("--only", choices=MEASUREMENTS, help="one measurement only (default: both)")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "smollm2-135m-instruct")
    parser.add_argument(
        "--model-config",
        type=Path,
        default=REPO / "model-config.yaml",
        help="the model-config.yaml to serve (e.g. a copy with a larger limit on constraint size)",
    )
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-hostile")
    parser.add_argument("--abandoned", type=int, default=200, help="abandoned requests (half streamed)")
    parser.add_argument("--abandoned-tokens", type=int, default=200, help="max_tokens of each abandoned request")
    parser.add_argument("--settle-s", type=float, default=10.0, help="quiet after the flood before the probe")
    parser.add_argument("--probe-tokens", type=int, default=16, help="max_tokens of the normal request")
    parser.add_argument("--bystander-tokens", type=int, default=64)
    parser.add_argument("--alone-repeats", type=int, default=3, help="requests alone (after a warm-up): medians")
    parser.add_argument("--schema-clients", type=int, default=4)
    parser.add_argument("--schema-bytes", type=int, default=900_000, help="each schema's JSON size")
    parser.add_argument("--schema-max-tokens", type=int, default=16, help="max_tokens of each schema request")
    parser.add_argument("--schema-lead-s", type=float, default=1.0, help="schema traffic before the bystander starts")
    parser.add_argument("--grace-s", type=float, default=30.0, help="for the schema requests in flight at the end")
    parser.add_argument("--idle-timeout-s", type=float, default=120.0, help="wait for empty slots between measurements")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="any one request")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.abandoned, args.abandoned_tokens, args.probe_tokens, args.alone_repeats, args.schema_clients) < 1:
        parser.error("counts and token numbers must be at least 1")
    if args.bystander_tokens < 2:
        parser.error("--bystander-tokens must be at least 2 (a gap needs two chunks)")
    args.frontends = list(FRONTENDS) if args.frontend == "both" else [args.frontend]
    args.measurements = [args.only] if args.only else list(MEASUREMENTS)
    args.model_dir, args.workdir = args.model_dir.resolve(), args.workdir.resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = yaml.safe_load(args.model_config.read_text())
    started, load_start = time.monotonic(), os.getloadavg()
    results = {frontend: run_frontend(frontend, args, config) for frontend in args.frontends}
    meta = {
        "argv": sys.argv[1:] if argv is None else argv,
        "model_dir": str(args.model_dir),
        "model_config": str(args.model_config),
        "cpus": os.cpu_count(),
        "load_average_start": list(load_start),
        "load_average_end": list(os.getloadavg()),
        "seconds": round(time.monotonic() - started, 1),
    }
    print(format_table(list(results), rows(results)))
    print(
        f"{meta['seconds']:.0f} s; 1-min load average {load_start[0]:.2f} -> {meta['load_average_end'][0]:.2f} on "
        f"{meta['cpus']} CPUs; one run's figures, not a verdict"
    )
    for frontend, result in results.items():
        for error in result.get("schema", {}).get("schema_errors", []):
            print(f"{frontend} schema answer: {error}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"meta": meta, "frontends": results}, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
