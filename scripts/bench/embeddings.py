"""`make bench-embed`: the embedding archive served vs the same encoder in-process (P13).

    P13 = served embeddings/s, 32 concurrent clients, one 128-token input per request, on the archive
          of configs/model-config-embed.yaml (classic batching, batchSize 8)
          / HFEncoder.encode's embeddings/s in-process on batches of 8 x 128 tokens      (goal >= 0.8 on CPU)

The model is all-MiniLM-L6-v2 (models/all-minilm-l6-v2, `make model`) on CPU with `cpu_threads: 1`
served and in-process (one core for the model; the frontend, the worker's Python and these clients
share the other, as P5 does). In one run:
  1. in-process: `HFEncoder.encode` on the same texts' token ids, batches of 1 and of 8 (best of the
     runs before and after the served loads, so the reference is the quietest figure);
  2. the dynamic-batch archive (batchSize 8, maxBatchDelay 5 ms): 32 clients with `encoding_format`
     float, the same with base64, then one client alone (the idle p50);
  3. a batchSize 1 archive: 32 clients, then one client alone: the batching gain is 2's ÷ 3's.
Each request is one text that tokenizes to exactly 128 tokens ([CLS] + 126 words + [SEP]: corpus words
that are one WordPiece each), sent to the OpenAI route `/predictions/<model>/1.0/v1/embeddings`.
Beside each load: the batches TorchServe formed (requests per handler call) and the worker's own
encode time per batch, read from the worker's log. Prints a table and the ratios; writes
bench_results/bench-embed.json.

    python -m scripts.bench.embeddings --model-dir models/all-minilm-l6-v2 --workdir build/bench-embed
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]

from handler.backends.encoder import HFEncoder
from handler.config import ServingConfig
from scripts.bench.stats import percentile
from scripts.serve.local_torchserve import TorchServe, start_torchserve

MODEL_NAME = "minilm"
CORPUS = REPO / "scripts" / "model" / "corpus.txt"
TOKENS = 128  # per input, [CLS] and [SEP] included
BATCH = 8  # the archive's batchSize and the in-process batch
CLIENTS = 32
GOAL = 0.8
BATCH_LINE = re.compile(r"embedding batch: (\d+) request\(s\), (\d+) input\(s\), \d+ tokens, encoded in ([\d.]+) ms")


# -- what to send ------------------------------------------------------------------------
def make_texts(encoder: HFEncoder, count: int, tokens: int = TOKENS) -> list[str]:
    """`count` distinct texts of exactly `tokens` tokens: corpus words that are one WordPiece each
    (BERT's tokenizer splits on whitespace first, so n such words are n tokens), joined by spaces."""
    words = []
    for word in dict.fromkeys(CORPUS.read_text().split()):
        if word.isalpha() and len(encoder.tokenize(word)) == 3:  # [CLS] word [SEP]
            words.append(word)
    per_text = tokens - 2
    if len(words) < 2:
        raise SystemExit(f"{CORPUS}: too few single-token words to build {tokens}-token inputs")
    texts = []
    for i in range(count):
        picked = [words[(i * 7 + j * (i % 5 + 1)) % len(words)] for j in range(per_text)]
        text = " ".join(picked)
        n = len(encoder.tokenize(text))
        if n != tokens:
            raise SystemExit(f"built a text of {n} tokens, not {tokens}: {text[:80]!r}")
        texts.append(text)
    return texts


# -- in-process reference -----------------------------------------------------------------
def in_process(encoder: HFEncoder, rows: Sequence[Sequence[int]], batch: int, seconds: float = 3.0) -> dict[str, float]:
    """HFEncoder.encode over `rows` in batches of `batch` for about `seconds`: embeddings/s and the
    median batch time."""
    encoder.encode(rows[:batch])  # warm
    times = []
    done = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        for start in range(0, len(rows) - batch + 1, batch):
            t0 = time.perf_counter()
            encoder.encode(rows[start : start + batch])
            times.append(time.perf_counter() - t0)
            done += batch
    return {
        "batch": batch,
        "embeddings_per_s": done / sum(times),
        "batch_ms_p50": statistics.median(times) * 1000,
        "batches": len(times),
    }


# -- the served loads ---------------------------------------------------------------------
@dataclass
class LoadResult:
    name: str
    archive_batch_size: int
    clients: int
    encoding_format: str
    requests: int
    failed: int
    embeddings_per_s: float
    latency_ms_p50: float
    latency_ms_p90: float
    handler_calls: int = 0
    requests_per_call: float = 0.0
    encode_ms_per_call: float = 0.0
    encode_share: float = 0.0  # of the load's wall time, the worker's encode calls


def model_config(batch_size: int, max_batch_delay_ms: int) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "configs" / "model-config-embed.yaml").read_text())
    config["batchSize"] = batch_size
    config["maxBatchDelay"] = max_batch_delay_ms
    config["jobQueueSize"] = max(config.get("jobQueueSize", 0), 2 * CLIENTS)  # never a 503 from the queue
    config["handler"]["cpu_threads"] = 1
    return config


def _check(body: bytes, encoding_format: str, dimension: int) -> None:
    data = json.loads(body)["data"]
    vector = data[0]["embedding"]
    size = len(base64.b64decode(vector)) // 4 if encoding_format == "base64" else len(vector)
    if len(data) != 1 or size != dimension:
        raise ValueError(f"a reply with {len(data)} vectors of {size} dimensions")


async def drive(
    server: TorchServe,
    texts: Sequence[str],
    clients: int,
    per_client: int,
    encoding_format: str,
    dimension: int,
) -> tuple[list[float], int, float]:
    """`clients` closed-loop clients, each sending `per_client` one-input requests in turn (the
    next when the last is answered): the latencies (s) of the answered ones, failures, wall (s)."""
    url = f"{server.predictions_url}/1.0/v1/embeddings"
    latencies: list[float] = []
    failed = 0
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)

    async def client(c: int, http: httpx.AsyncClient) -> None:
        nonlocal failed
        for k in range(per_client):
            body = {"model": MODEL_NAME, "input": texts[(c * per_client + k) % len(texts)]}
            body["encoding_format"] = encoding_format
            t0 = time.perf_counter()
            try:
                response = await http.post(url, json=body)
                response.raise_for_status()
                _check(response.content, encoding_format, dimension)
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                failed += 1
                if failed <= 3:
                    print(f"  request failed: {exc!r}"[:300], flush=True)
                continue
            latencies.append(time.perf_counter() - t0)

    async with httpx.AsyncClient(headers=server.headers, timeout=120, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(c, http) for c in range(clients)))
        wall = time.perf_counter() - started
    return latencies, failed, wall


def worker_batches(server: TorchServe, skip: int) -> list[tuple[int, float]]:
    """(requests, encode ms) of each handler call the worker logged, after the first `skip`."""
    found = BATCH_LINE.findall(server.log_text())
    return [(int(requests), float(ms)) for requests, _, ms in found[skip:]]


def run_load(
    server: TorchServe,
    name: str,
    batch_size: int,
    texts: Sequence[str],
    clients: int,
    per_client: int,
    encoding_format: str,
    dimension: int,
) -> LoadResult:
    logged = len(worker_batches(server, 0))
    latencies, failed, wall = asyncio.run(drive(server, texts, clients, per_client, encoding_format, dimension))
    time.sleep(0.5)  # the worker's log lines reach model_log.log through the frontend
    calls = worker_batches(server, logged)
    encode_ms = [ms for _, ms in calls]
    result = LoadResult(
        name=name,
        archive_batch_size=batch_size,
        clients=clients,
        encoding_format=encoding_format,
        requests=len(latencies),
        failed=failed,
        embeddings_per_s=len(latencies) / wall,
        latency_ms_p50=percentile(latencies, 50) * 1000,
        latency_ms_p90=percentile(latencies, 90) * 1000,
        handler_calls=len(calls),
        requests_per_call=sum(r for r, _ in calls) / len(calls) if calls else 0.0,
        encode_ms_per_call=statistics.mean(encode_ms) if encode_ms else 0.0,
        encode_share=sum(encode_ms) / 1000 / wall if wall else 0.0,
    )
    print(f"  {format_row(result)}", flush=True)
    return result


def serve_and_measure(
    workdir: Path,
    model_dir: Path,
    batch_size: int,
    max_batch_delay_ms: int,
    texts: Sequence[str],
    per_client: int,
    formats: Sequence[str],
    dimension: int,
) -> list[LoadResult]:
    config = model_config(batch_size, max_batch_delay_ms)
    print(f"archive batchSize {batch_size}, maxBatchDelay {max_batch_delay_ms} ms: starting torchserve", flush=True)
    server = start_torchserve(workdir, model_dir, config, model_name=MODEL_NAME, ready_timeout=180)
    results = []
    try:
        asyncio.run(drive(server, texts, CLIENTS, 2, "float", dimension))  # warm-up: frontend, worker, connections
        for encoding_format in formats:
            name = f"batch {batch_size}, {CLIENTS} clients, {encoding_format}"
            results.append(run_load(server, name, batch_size, texts, CLIENTS, per_client, encoding_format, dimension))
        name = f"batch {batch_size}, 1 client, float"
        results.append(run_load(server, name, batch_size, texts, 1, per_client, "float", dimension))
    finally:
        server.stop()
    return results


# -- report -------------------------------------------------------------------------------
HEADER = f"{'load':34} {'emb/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'req/call':>8} {'enc ms':>7} {'enc %':>6} {'fail':>5}"


def format_row(r: LoadResult) -> str:
    return (
        f"{r.name:34} {r.embeddings_per_s:8.1f} {r.latency_ms_p50:8.1f} {r.latency_ms_p90:8.1f} "
        f"{r.requests_per_call:8.2f} {r.encode_ms_per_call:7.1f} {100 * r.encode_share:5.0f}% {r.failed:5d}"
    )


def ratios(loads: list[LoadResult], reference: dict[str, dict[str, float]]) -> dict[str, float]:
    by_name = {r.name: r for r in loads}
    dynamic = by_name[f"batch {BATCH}, {CLIENTS} clients, float"]
    single = by_name[f"batch 1, {CLIENTS} clients, float"]
    out = {
        "P13": dynamic.embeddings_per_s / reference[f"batch_{BATCH}"]["embeddings_per_s"],
        "P13-batch1": single.embeddings_per_s / reference["batch_1"]["embeddings_per_s"],
        "batching_gain": dynamic.embeddings_per_s / single.embeddings_per_s,
        "in_process_batching_gain": reference[f"batch_{BATCH}"]["embeddings_per_s"]
        / reference["batch_1"]["embeddings_per_s"],
    }
    b64 = by_name.get(f"batch {BATCH}, {CLIENTS} clients, base64")
    if b64 is not None:
        out["P13-base64"] = b64.embeddings_per_s / reference[f"batch_{BATCH}"]["embeddings_per_s"]
    return out


def best(runs: list[dict[str, float]]) -> dict[str, float]:
    return max(runs, key=lambda run: run["embeddings_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "all-minilm-l6-v2")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-embed")
    parser.add_argument("--requests-per-client", type=int, default=8, help="per client, each load (32 clients)")
    parser.add_argument("--max-batch-delay", type=int, default=5, help="ms, the dynamic-batch archive's")
    parser.add_argument("--reference-seconds", type=float, default=3.0, help="per in-process run")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "bench-embed.json")
    args = parser.parse_args()
    model_dir, workdir = args.model_dir.resolve(), args.workdir.resolve()

    config = ServingConfig.from_model_yaml(model_config(BATCH, args.max_batch_delay))
    encoder = HFEncoder(config.handler, model_dir)
    texts = make_texts(encoder, CLIENTS * 4)
    rows = [encoder.tokenize(text) for text in texts]
    reference_runs: dict[str, list[dict[str, float]]] = {"batch_1": [], f"batch_{BATCH}": []}

    def measure_in_process() -> None:
        for batch in (1, BATCH):
            run = in_process(encoder, rows, batch, args.reference_seconds)
            reference_runs[f"batch_{batch}"].append(run)
            print(
                f"  in-process batch {batch} x {TOKENS}: {run['embeddings_per_s']:.1f} emb/s, "
                f"{run['batch_ms_p50']:.1f} ms per batch",
                flush=True,
            )

    started, load_at_start = time.perf_counter(), os.getloadavg()
    print(f"in-process HFEncoder.encode, {TOKENS}-token inputs, cpu_threads 1 (before the served loads)", flush=True)
    measure_in_process()
    print(HEADER, flush=True)
    loads = serve_and_measure(
        workdir / "dynamic",
        model_dir,
        BATCH,
        args.max_batch_delay,
        texts,
        args.requests_per_client,
        ("float", "base64"),
        encoder.dimension,
    )
    loads += serve_and_measure(
        workdir / "batch1", model_dir, 1, 1, texts, args.requests_per_client, ("float",), encoder.dimension
    )
    print("in-process (after the served loads)", flush=True)
    measure_in_process()
    reference = {name: best(runs) for name, runs in reference_runs.items()}
    result = ratios(loads, reference)

    print()
    print(HEADER)
    for load in loads:
        print(format_row(load))
    for name, run in reference.items():
        print(f"{'in-process ' + name.replace('_', ' '):34} {run['embeddings_per_s']:8.1f} {run['batch_ms_p50']:8.1f}")
    print(
        f"batching gain (served, batch {BATCH} / batch 1, {CLIENTS} clients): {result['batching_gain']:.2f}; "
        f"in-process {result['in_process_batching_gain']:.2f}"
    )
    print(f"P13-batch1 {result['P13-batch1']:.2f} (served batchSize 1 / in-process batch 1)")
    if "P13-base64" in result:
        print(f"P13-base64 {result['P13-base64']:.2f} (goal >= {GOAL}) base64 replies")
    dynamic = next(r for r in loads if r.name == f"batch {BATCH}, {CLIENTS} clients, float")
    print(
        f"P13 {result['P13']:.2f} (goal >= {GOAL}) served {dynamic.embeddings_per_s:.1f} emb/s / in-process "
        f"{reference[f'batch_{BATCH}']['embeddings_per_s']:.1f} emb/s at batch {BATCH} x {TOKENS} tokens"
    )
    elapsed = time.perf_counter() - started
    out = {
        "model": str(model_dir.relative_to(REPO)) if model_dir.is_relative_to(REPO) else str(model_dir),
        "tokens_per_input": TOKENS,
        "batch": BATCH,
        "clients": CLIENTS,
        "requests_per_client": args.requests_per_client,
        "max_batch_delay_ms": args.max_batch_delay,
        "cpu_threads": 1,
        "cpus": os.cpu_count(),
        "loadavg_at_start": load_at_start,  # 1, 5, 15 min: other jobs on the same cores lower P13 first
        "loadavg_at_end": os.getloadavg(),
        "elapsed_s": elapsed,
        "in_process": reference,
        "in_process_runs": reference_runs,
        "loads": [asdict(load) for load in loads],
        "ratios": result,
        "goal": {"P13": [">=", GOAL]},
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(f"load average (1 min) {load_at_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    print(f"{args.out} written ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
