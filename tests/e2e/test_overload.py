"""Overload: a burst far beyond what the model holds gets 200s and fast 503s, nothing hangs.

A real torchserve serves the sim backend with a small, slow model (2 slots, 50 ms decode
steps), `batchSize` 4 (2 decoding + 2 waiting in the worker) and `jobQueueSize` 4 in the
frontend. A burst of 10 x (4 + 4) concurrent requests over every route (native streamed and
not, OpenAI completions and chat, SageMaker's /invocations) must get only complete 200s
(a finish_reason) and TorchServe's 503 JSON error, each 503 at once; no request may time out.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from scripts.bench.stats import percentile
from tests.support.torchserve_process import TorchServe, copy_logs_on_failure, start_torchserve

N_SLOTS, BATCH_SIZE, JOB_QUEUE_SIZE = 2, 4, 4
BURST = 10 * (BATCH_SIZE + JOB_QUEUE_SIZE)
MAX_TOKENS = 24  # x 50 ms per step: each accepted request decodes for about 1.2 s
FAST_503_S = 2.0  # generous: TorchServe answers from its queue check, without the worker
CLIENT_TIMEOUT_S = 60.0


def slow_profile(path: Path) -> Path:
    """A 2-slot compiled model with slow steps, so the burst outruns it."""
    path.write_text(
        yaml.safe_dump(
            {
                "name": "overload-test",
                "source": "made up for tests/e2e/test_overload.py",
                "batch_size": N_SLOTS,
                "n_positions": 1024,
                "vocab_size": 32000,
                "context_buckets": [64, 128, 256, 512],
                "decode_step_ms": {1: 40.0, 2: 50.0},
                "prefill_ms": {128: 20.0},
            }
        )
    )
    return path


def overload_config(model_dir: Path, profile: Path) -> dict[str, Any]:
    return {
        "minWorkers": 1,
        "maxWorkers": 1,
        "continuousBatching": True,
        "batchSize": BATCH_SIZE,
        "jobQueueSize": JOB_QUEUE_SIZE,
        "maxBatchDelay": 1,
        "responseTimeout": 60,
        "handler": {
            "model_checkpoint_dir": str(model_dir),
            "backend": "sim",
            "n_positions": 1024,
            "default_max_new_tokens": 16,
            "max_new_tokens": 256,
            "sim": {"profile": str(profile), "time_scale": 1.0},
        },
        "scheduler": {"mode": "continuous", "n_slots": N_SLOTS},
    }


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    workdir = tmp_path_factory.mktemp("overload")
    config = overload_config(tiny_model_dir, slow_profile(workdir / "profile.yaml"))
    ts = start_torchserve(workdir / "ts", tiny_model_dir, config)
    try:
        yield ts
    finally:
        ts.stop()


# -- the burst ---------------------------------------------------------------------------
@dataclass
class Answer:
    route: str
    status: int | None = None
    seconds: float = 0.0
    body: Any = None
    finish_reason: str | None = None
    error: str | None = None  # a client-side failure: timeout, connection error, bad body


ROUTES: dict[str, tuple[str, dict[str, Any]]] = {
    "native stream": ("/predictions/llama", {"prompt": "Burst", "max_new_tokens": MAX_TOKENS, "ignore_eos": True}),
    "native one-shot": (
        "/predictions/llama",
        {"prompt": "Burst", "max_new_tokens": MAX_TOKENS, "ignore_eos": True, "stream": False},
    ),
    "openai completions": (
        "/predictions/llama/1.0/v1/completions",
        {"model": "llama", "prompt": "Burst", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True},
    ),
    "openai chat": (
        "/predictions/llama/1.0/v1/chat/completions",
        {"model": "llama", "messages": [{"role": "user", "content": "Burst"}], "max_tokens": MAX_TOKENS},
    ),
    "invocations": ("/invocations", {"inputs": "Burst", "parameters": {"max_new_tokens": MAX_TOKENS}}),
}


def finish_reason(route: str, text: str) -> str | None:
    """The finish_reason a 200 ended with, whatever the route's format."""
    lines = [line for line in text.splitlines() if line.strip()]
    found = None
    for line in lines:
        if line.startswith("data:"):
            payload = line[5:].strip()
            if payload == "[DONE]":
                continue
            obj = json.loads(payload)
        else:
            obj = json.loads(line)
        choices = obj.get("choices") or [{}]
        found = obj.get("finish_reason") or choices[0].get("finish_reason") or found
    return found


async def one(client: httpx.AsyncClient, server: TorchServe, route: str) -> Answer:
    path, body = ROUTES[route]
    answer = Answer(route)
    started = time.perf_counter()
    try:
        response = await client.post(server.url + path, json=body, headers=server.headers)
        answer.status, answer.seconds = response.status_code, time.perf_counter() - started
        if response.status_code == 200:
            answer.finish_reason = finish_reason(route, response.text)
        else:
            answer.body = response.json()
    except (httpx.HTTPError, ValueError) as exc:
        answer.error = f"{type(exc).__name__}: {exc}"
        answer.seconds = time.perf_counter() - started
    return answer


async def burst(server: TorchServe) -> list[Answer]:
    names = list(ROUTES)
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=CLIENT_TIMEOUT_S) as client:
        return await asyncio.gather(*(one(client, server, names[i % len(names)]) for i in range(BURST)))


@pytest.mark.timeout(240)
def test_a_burst_of_ten_times_the_queue_gets_only_complete_200s_and_fast_503s(server: TorchServe, request):
    try:
        check_burst(server)
    except BaseException:
        copy_logs_on_failure(server, request.config.rootpath / "build" / "test-logs" / "overload")
        raise


def check_burst(server: TorchServe) -> None:
    answers = asyncio.run(burst(server))

    ok = [a for a in answers if a.status == 200]
    busy = [a for a in answers if a.status == 503]
    other = [a for a in answers if a.status not in (200, 503)]
    latencies = [a.seconds for a in busy]
    print(
        f"\nburst of {BURST} (batchSize {BATCH_SIZE} + jobQueueSize {JOB_QUEUE_SIZE}): {len(ok)} x 200, "
        f"{len(busy)} x 503, {len(other)} other; 503 latency p50 {percentile(latencies, 50) * 1000:.0f} ms, "
        f"max {max(latencies, default=float('nan')) * 1000:.0f} ms; 200 latency max "
        f"{max((a.seconds for a in ok), default=float('nan')):.2f} s"
    )
    for route in ROUTES:
        sample = next((a.body for a in busy if a.route == route), None)
        print(f"  {route}: {sum(a.route == route for a in ok)} x 200, 503 body {json.dumps(sample)}")

    assert not other, [(a.route, a.status, a.error, a.body) for a in other]  # no timeout, no other status
    # What the frontend guarantees on 0.11 and 0.12 alike: its job queue (a LinkedBlockingDeque of
    # jobQueueSize, Model.addJob) starts empty, so the first jobQueueSize arrivals are queued and
    # served. How many more get in depends on how fast the worker's aggregator pulls jobs into its
    # batch while the burst arrives (0.11 pulled one fewer here once: 7 of batchSize + jobQueueSize).
    assert len(ok) >= JOB_QUEUE_SIZE, "the frontend's queue should have taken its share"
    assert busy, "the burst never filled the queue"
    incomplete = [(a.route, a.finish_reason) for a in ok if a.finish_reason not in ("length", "stop")]
    assert not incomplete, incomplete
    for a in busy:
        assert a.body["code"] == 503 and a.body["type"] == "ServiceUnavailableException", a.body
        assert "has no worker to serve inference request" in a.body["message"], a.body  # TorchServe's wording
    assert max(latencies) < FAST_503_S, sorted(latencies)[-5:]
    assert {a.route for a in busy} == set(ROUTES), "every route is refused the same way"

    # The server has recovered: the next request is served.
    response = httpx.post(
        server.predictions_url, json={"prompt": "After", "max_new_tokens": 4, "stream": False}, headers=server.headers
    )
    assert response.status_code == 200 and response.json()["finish_reason"] == "length"
