"""Arrival -> prefill start, in engine steps, on the ASGI frontend and on TorchServe (issue 35:
goal <= 1 step on the ASGI frontend): the same sim engine and profile behind each.

BACKGROUND long streams keep the engine stepping (fewer than its slots, so a probe never waits
for one); PROBES short requests (one token, not streamed) then arrive one at a time at random
moments within a step, each stamped `X-Request-Start` by the client, so both frontends count its
queue wait (`llm_queue_wait_seconds`: the stamp to its prefill's start) from the moment it was
sent. Steps = the probes' mean queue wait / the mean decode step (`llm_decode_step_seconds`),
both read from each frontend's Prometheus metrics before and after the probes.

    .venv/bin/python -m scripts.bench.frontend_admission [--probes 30] [--frontends asgi torchserve]

A benchmark, not a test: it prints figures and decides nothing.
"""

from __future__ import annotations

import argparse
import random
import re
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.serve.local_asgi import start_asgi_frontend
from scripts.serve.local_torchserve import start_torchserve

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
N_SLOTS = 8
BACKGROUND = 4
CONFIG: dict[str, Any] = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "continuousBatching": True,
    "batchSize": 2 * N_SLOTS,
    "jobQueueSize": 4 * N_SLOTS,
    "maxBatchDelay": 1,
    "responseTimeout": 120,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "sim",
        "n_positions": 4096,
        "default_max_new_tokens": 16,
        "max_new_tokens": 3000,
        "sim": {"profile": str(PROFILE), "time_scale": 1.0},
    },
    "scheduler": {"mode": "continuous", "n_slots": N_SLOTS, "overlap": True},
}


def summed(metrics: str, name: str) -> float:
    """The sum over every label set of `name` in Prometheus text."""
    return sum(float(v) for v in re.findall(rf"^{name}(?:\{{[^}}]*\}})? (\S+)$", metrics, re.MULTILINE))


def background_streams(server: Any, stop: threading.Event) -> list[threading.Thread]:
    body = {"prompt": "Once upon a time", "max_new_tokens": 3000, "ignore_eos": True}

    def run() -> None:
        while not stop.is_set():
            with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=300) as r:
                for _ in r.iter_raw():
                    if stop.is_set():
                        return  # closing the connection aborts it

    threads = [threading.Thread(target=run, daemon=True) for _ in range(BACKGROUND)]
    for thread in threads:
        thread.start()
    return threads


def measure(server: Any, scrape: Any, probes: int) -> dict[str, float]:
    stop = threading.Event()
    threads = background_streams(server, stop)
    time.sleep(3)  # the streams are decoding
    before = scrape()
    step_s = (summed(before, "llm_decode_step_seconds_sum") or 0.03) / max(
        1.0, summed(before, "llm_decode_step_seconds_count")
    )
    latencies = []
    body = {"prompt": "A probe", "max_new_tokens": 1, "stream": False}
    with httpx.Client(timeout=60) as client:
        for _ in range(probes):
            time.sleep(random.uniform(0, 2 * step_s))
            started = time.perf_counter()
            headers = {**server.headers, "X-Request-Start": f"t={time.time():.6f}"}
            client.post(server.predictions_url, json=body, headers=headers).raise_for_status()
            latencies.append(time.perf_counter() - started)
    after = scrape()
    stop.set()
    for thread in threads:
        thread.join(30)
    delta = {
        name: summed(after, name) - summed(before, name)
        for name in (
            "llm_queue_wait_seconds_sum",
            "llm_queue_wait_seconds_count",
            "llm_decode_step_seconds_sum",
            "llm_decode_step_seconds_count",
        )
    }
    queue_wait = delta["llm_queue_wait_seconds_sum"] / max(1.0, delta["llm_queue_wait_seconds_count"])
    step = delta["llm_decode_step_seconds_sum"] / max(1.0, delta["llm_decode_step_seconds_count"])
    return {
        "probes": delta["llm_queue_wait_seconds_count"],
        "queue_wait_ms": queue_wait * 1000,
        "decode_step_ms": step * 1000,
        "steps_to_prefill": queue_wait / step if step else float("nan"),
        "probe_latency_ms": sorted(latencies)[len(latencies) // 2] * 1000,
    }


def run(frontend: str, model_dir: Path, probes: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix=f"admission-{frontend}-") as tmp:
        workdir = Path(tmp)
        if frontend == "asgi":
            server: Any = start_asgi_frontend(workdir, model_dir, CONFIG)

            def scrape() -> str:
                return httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
        else:
            server = start_torchserve(workdir, model_dir, CONFIG)
            scrape = server.scrape_metrics
        try:
            return measure(server, scrape, probes)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama", help="the tokenizer")
    parser.add_argument("--probes", type=int, default=30)
    parser.add_argument("--frontends", nargs="*", default=["asgi", "torchserve"], choices=["asgi", "torchserve"])
    args = parser.parse_args()
    print(
        f"{'frontend':11} {'probes':>6} {'queue wait ms':>14} {'decode step ms':>15} {'steps':>6} {'probe p50 ms':>13}"
    )
    for frontend in args.frontends:
        r = run(frontend, args.model_dir, args.probes)
        print(
            f"{frontend:11} {r['probes']:6.0f} {r['queue_wait_ms']:14.1f} {r['decode_step_ms']:15.1f} "
            f"{r['steps_to_prefill']:6.2f} {r['probe_latency_ms']:13.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
