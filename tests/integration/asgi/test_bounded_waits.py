"""Issue 42, item 2, on the ASGI frontend: a request that gets no slot within
handler.max_queue_wait_s is a fast 503 with Retry-After (counted in /metrics), while the requests
holding the slots stream on; the in-flight bound's 503 says Retry-After too."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.frontend.model import ServedModel
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process

N_SLOTS = 2


@pytest.fixture(scope="module")
def busy(tiny_model_dir: Path) -> Iterator[InProcessFrontend]:
    config = {
        "batchSize": 2 * N_SLOTS,
        "jobQueueSize": 2,
        "continuousBatching": True,
        "handler": {
            "model_checkpoint_dir": str(tiny_model_dir),
            "backend": "hf",
            "n_positions": 256,
            "max_new_tokens": 200,
            "max_queue_wait_s": 0.3,
        },
        "scheduler": {"mode": "continuous", "n_slots": N_SLOTS},
    }
    with running_in_process(ServedModel(config, tiny_model_dir)) as served:
        backend = served.model.core.backend  # type: ignore[union-attr]
        decode = backend.decode

        def slow_decode(slots):  # a busy device: the slots stay held for seconds
            time.sleep(0.05)
            return decode(slots)

        backend.decode = slow_decode
        yield served


def test_a_request_without_a_slot_is_a_503_with_retry_after_and_the_holders_stream_on(busy: InProcessFrontend):
    holder = {"model": "llama", "prompt": "holding a slot", "max_tokens": 60, "ignore_eos": True}
    waiter = {"model": "llama", "prompt": "waiting for one", "max_tokens": 4}

    async def scenario():
        holders = [asyncio.ensure_future(busy.client.post("/v1/completions", json=holder, headers=busy.headers))]
        holders.append(asyncio.ensure_future(busy.client.post("/v1/completions", json=holder, headers=busy.headers)))
        while busy.model.engine.occupied < N_SLOTS:  # type: ignore[union-attr]
            await asyncio.sleep(0.01)
        refused = await busy.client.post("/v1/completions", json=waiter, headers=busy.headers)
        still_running = not any(h.done() for h in holders)
        return refused, still_running, await asyncio.gather(*holders)

    refused, still_running, held = busy.run(scenario())
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["type"] == "service_unavailable"
    assert "max_queue_wait_s" in refused.json()["error"]["message"]
    assert still_running  # turned away while the slots were busy, not once they were free
    assert [h.status_code for h in held] == [200, 200]
    assert all(h.json()["usage"]["completion_tokens"] == 60 for h in held)
    metrics = busy.get("/metrics").text
    assert 'llm_rejected_requests_total{reason="queue_wait"} 1.0' in metrics


def test_the_in_flight_bound_is_a_503_with_retry_after(busy: InProcessFrontend):
    bound = busy.model.max_in_flight  # batchSize + jobQueueSize
    body = {"model": "llama", "prompt": "filling the server", "max_tokens": 30, "ignore_eos": True}

    async def scenario():
        sent = [asyncio.ensure_future(busy.client.post("/v1/completions", json=body, headers=busy.headers))]
        while busy.model.bridge.in_flight < 1:  # type: ignore[union-attr]
            await asyncio.sleep(0.005)
        sent += [
            asyncio.ensure_future(busy.client.post("/v1/completions", json=body, headers=busy.headers))
            for _ in range(2 * bound)
        ]
        return await asyncio.gather(*sent)

    answers = busy.run(scenario(), timeout=120)
    refused = [a for a in answers if a.status_code == 503]
    assert refused and all(a.headers.get("retry-after") == "1" for a in refused)
    assert {a.status_code for a in answers} <= {200, 503}
