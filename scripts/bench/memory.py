"""`make bench-memory`: the worker's memory is bounded by bytes, whatever distinct large things
clients send, and what a request right after an `n`-at-the-limit request waits.

Starts its own torchserve (tiny model, hf, continuous, 4 slots) and measures the worker's RSS:
  1. at baseline (after a constrained warm-up request);
  2. after N requests, each with a distinct ~0.95 MB enum schema (response_format json_schema):
     grammar texts and compiled matchers are cached within `handler.grammar.cache_mb`;
  3. after M requests, each a ~1 MB prompt (refused before it is tokenized).
Then `n` at the slot limit (n = 4) with a normal request sent 50 ms later: its time to first byte.

    python -m scripts.bench.memory --schemas 300 --prompts 100 --cache-mb 256
Writes bench_results/memory.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
from scripts.serve.local_torchserve import TorchServe, start_torchserve

MIB = 2**20
SLOTS = 4


def model_config(cache_mb: int) -> dict[str, Any]:
    return {
        "minWorkers": 1,
        "maxWorkers": 1,
        "continuousBatching": True,
        "batchSize": 2 * SLOTS,
        "maxBatchDelay": 1,
        "responseTimeout": 120,
        "handler": {
            "model_checkpoint_dir": "model",
            "backend": "hf",
            "n_positions": 1024,
            "max_new_tokens": 256,
            "grammar": {"cache_mb": cache_mb},
        },
        "scheduler": {"mode": "continuous", "n_slots": SLOTS},
    }


def worker_rss_mib(server: TorchServe) -> float:
    """The RSS of the worker processes (the frontend's Python children and theirs)."""
    total = 0
    for pid in server.worker_pids():
        try:
            process = psutil.Process(pid)
            total += process.memory_info().rss
            total += sum(child.memory_info().rss for child in process.children(recursive=True))
        except psutil.Error:
            continue
    return total / MIB


def schema_body(i: int, model: str) -> dict[str, Any]:
    """A chat request whose schema is a distinct enum of about 0.9 MB (within the 1 MiB body limit)."""
    values = [f"{i:04d}-{j}-" + "v" * 20 for j in range(28_000)]
    schema = {"type": "object", "properties": {"pick": {"type": "string", "enum": values}}, "required": ["pick"]}
    return {
        "model": model,
        "messages": [{"role": "user", "content": "pick one"}],
        "max_tokens": 2,
        "response_format": {"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}},
    }


async def send_all(server: TorchServe, bodies: list[tuple[str, dict[str, Any]]], concurrency: int) -> dict[int, int]:
    """POST every (route, body); the count of each status."""
    statuses: dict[int, int] = {}
    queue: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
    for item in bodies:
        queue.put_nowait(item)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            route, body = queue.get_nowait()
            url = f"{server.predictions_url}{route}"
            reply = await client.post(url, content=json.dumps(body).encode(), headers=server.headers, timeout=120)
            statuses[reply.status_code] = statuses.get(reply.status_code, 0) + 1

    async with httpx.AsyncClient(headers={"Content-Type": "application/json"}) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    return statuses


def wait_after_n_at_the_limit(server: TorchServe) -> dict[str, float]:
    """A request sent 50 ms after one with n = the slots: the time to its first byte, against alone."""

    def first_byte(body: dict[str, Any], out: dict[str, float], key: str) -> None:
        started = time.perf_counter()
        with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=120) as r:
            for _ in r.iter_bytes():
                out.setdefault(key, time.perf_counter() - started)

    normal = {"prompt": "Today the weather is", "max_new_tokens": 8}
    many = {
        "model": server.model_name,
        "prompt": "Today the weather is",
        "max_tokens": 200,
        "n": SLOTS,
        "ignore_eos": True,
    }
    out: dict[str, float] = {}
    first_byte(normal, out, "alone_s")
    holder = threading.Thread(
        target=lambda: httpx.post(
            f"{server.predictions_url}/1.0/v1/completions", json=many, headers=server.headers, timeout=120
        )
    )
    holder.start()
    time.sleep(0.05)
    first_byte(normal, out, "after_n_at_limit_s")
    holder.join()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schemas", type=int, default=300)
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--cache-mb", type=int, default=256)
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as workdir:
        server = start_torchserve(Path(workdir), args.model_dir, model_config(args.cache_mb))
        try:
            report = measure(server, args)
        finally:
            server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))


def measure(server: TorchServe, args: argparse.Namespace) -> dict[str, Any]:
    chat = "/1.0/v1/chat/completions"
    asyncio.run(send_all(server, [(chat, schema_body(-1, server.model_name))], 1))
    baseline = worker_rss_mib(server)
    started = time.perf_counter()
    schema_status = asyncio.run(
        send_all(server, [(chat, schema_body(i, server.model_name)) for i in range(args.schemas)], 2)
    )
    after_schemas = worker_rss_mib(server)
    schema_s = time.perf_counter() - started
    prompt = "word " * 200_000  # 1 MB
    prompt_status = asyncio.run(send_all(server, [("", {"prompt": prompt})] * args.prompts, 2))
    after_prompts = worker_rss_mib(server)
    return {
        "cache_mb": args.cache_mb,
        "baseline_rss_mib": round(baseline, 1),
        "schemas": {"count": args.schemas, "statuses": schema_status, "seconds": round(schema_s, 1)},
        "after_schemas_rss_mib": round(after_schemas, 1),
        "schemas_growth_mib": round(after_schemas - baseline, 1),
        "prompts": {"count": args.prompts, "statuses": prompt_status},
        "after_prompts_rss_mib": round(after_prompts, 1),
        "n_at_the_limit": wait_after_n_at_the_limit(server),
    }


if __name__ == "__main__":
    main()
