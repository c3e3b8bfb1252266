"""A real torchserve process, real HTTP, concurrent clients."""

from __future__ import annotations

import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import E2E_MODEL_CONFIG, FAILPOINT_MARKER
from tests.support.streaming import assert_first_arrived_while_generating, timed
from tests.support.torchserve_process import TorchServe

BATCH_DELAY_S = E2E_MODEL_CONFIG["maxBatchDelay"] / 1000
pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/support/asgi_frontend.py)


@dataclass
class Streamed:
    status: int
    headers: httpx.Headers
    started: float  # time.perf_counter() when the request was sent
    arrivals: list[tuple[float, bytes]]  # (perf_counter, bytes) per chunk, as the client received it

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.arrivals]

    @property
    def timed_lines(self) -> list[tuple[float, dict[str, Any]]]:
        """Each NDJSON line with the moment the chunk that completed it arrived."""
        out, pending = [], b""
        for at, data in self.arrivals:
            *complete, pending = (pending + data).split(b"\n")
            out += [(at, json.loads(line)) for line in complete if line.strip()]
        assert not pending.strip(), pending[-200:]
        return out

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [line for _, line in self.timed_lines]

    @property
    def request_id(self) -> str:
        request_id = self.headers.get("x-request-id")
        assert request_id, f"no x-request-id header in {dict(self.headers)}"
        return request_id


def stream(server, body: dict, first_chunk: threading.Event | None = None) -> Streamed:
    """POST and read the body chunk by chunk, noting when each chunk arrived
    (and setting `first_chunk`, if given, when the first one does)."""
    started = time.perf_counter()
    with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
        arrivals = []
        for arrival in timed(response.iter_raw()):
            arrivals.append(arrival)
            if first_chunk is not None:
                first_chunk.set()
        return Streamed(response.status_code, response.headers, started, arrivals)


def ndjson(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line]


def post(server, body) -> httpx.Response:
    return httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60)


def frontend_batches(server) -> list[set[str]]:
    """The request ids of every frontend batch the handler logged, in order
    (static mode, handler/serving/static.py: "frontend batch of N request(s): id1,id2,...")."""
    logged = re.findall(r"frontend batch of (\d+) request\(s\): (\S+)", server.log_text())
    batches = [set(ids.split(",")) for _, ids in logged]
    assert all(int(n) == len(ids) for (n, _), ids in zip(logged, batches, strict=True)), logged[-5:]
    return batches


def assert_one_batch(server, request_ids: list[str]) -> None:
    """These requests, and no others, made up one frontend batch (so one micro-batch here:
    micro_batch_size >= batchSize). Matched by id: other tests' batches cannot satisfy it."""
    assert len(set(request_ids)) == len(request_ids), request_ids
    batches = frontend_batches(server)
    holding = [b for b in batches if b & set(request_ids)]
    assert holding == [set(request_ids)], f"batches holding {request_ids}: {holding}"


def test_chunks_arrive_while_generating(server):
    body = {"prompt": "Once upon a time", "max_new_tokens": 400, "ignore_eos": True}
    response = stream(server, body)
    assert response.status == 200
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = response.lines
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"]["completion_tokens"] == 400
    assert len(response.arrivals) > 20
    assert_first_arrived_while_generating(response.started, response.times, BATCH_DELAY_S)


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_stream_concatenation_equals_non_streamed_text(server):
    body = {"prompt": "Streaming sends each piece of text", "max_new_tokens": 60, "ignore_eos": True}
    streamed = stream(server, body)
    whole = post(server, {**body, "stream": False})
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "application/json"
    lines = streamed.lines
    assert "".join(line["text"] for line in lines) == whole.json()["text"]
    assert lines[-1]["usage"] == whole.json()["usage"]


def concurrently(server, bodies):
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: post(server, b), bodies))


def test_concurrent_requests_are_all_answered(server):
    bodies = [{"prompt": f"Request number {i}", "max_new_tokens": 16, "stream": False} for i in range(4)]
    responses = concurrently(server, bodies)
    assert [r.status_code for r in responses] == [200] * 4
    if server.mode == "static":
        assert_one_batch(server, [r.headers.get("x-request-id", "") for r in responses])
    else:  # the continuous invariant through a real TorchServe: sharing steps changes no greedy token
        alone = [post(server, body).json()["text"] for body in bodies]
        assert [r.json()["text"] for r in responses] == alone


def test_one_invalid_request_in_a_concurrent_batch(server):
    good = {"prompt": "The quick brown fox", "max_new_tokens": 24, "ignore_eos": True, "stream": False}
    bodies = [good, {"prompt": "x", "temperature": -1}, good, {"prompt": "y", "max_new_tokens": 100000}]
    responses = concurrently(server, bodies)
    assert [r.status_code for r in responses] == [200, 400, 200, 400]
    assert responses[1].json()["error"]["param"] == "temperature"
    assert responses[3].json()["error"]["param"] == "max_new_tokens"
    for r in (responses[0], responses[2]):
        assert r.json()["usage"]["completion_tokens"] == 24
    assert responses[0].json()["text"] == responses[2].json()["text"]


def test_server_keeps_serving_after_a_failure_inside_generate(server):
    failed = post(
        server, {"prompt": f"{FAILPOINT_MARKER} go", "max_new_tokens": 50, "ignore_eos": True, "stream": False}
    )
    # TorchServe in continuous mode opens a response before its prefill (to learn whether its client
    # is there: docs/operations.md#a-client-that-leaves), so a failure after it comes under the 200
    opened_early = isinstance(server, TorchServe) and server.mode == "continuous"
    assert failed.status_code == (200 if opened_early else 500)
    assert failed.json()["error"]["type"] == "server_error"
    streamed = stream(server, {"prompt": f"{FAILPOINT_MARKER} go", "max_new_tokens": 50, "ignore_eos": True})
    assert streamed.status == 200 and "error" in streamed.lines[-1]
    after = post(server, {"prompt": "Are you still there?", "max_new_tokens": 8, "stream": False})
    assert after.status_code == 200
    assert after.json()["finish_reason"] in {"eos", "length"}


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_plain_text_and_sagemaker_style_bodies(server):
    plain = httpx.post(
        server.predictions_url,
        content=b"Today the weather is really nice and",
        headers={**server.headers, "Content-Type": "application/json"},  # as the seed's SageMaker client sends it
        timeout=60,
    )
    assert plain.status_code == 200
    assert ndjson(plain.text)[-1]["finish_reason"] in {"eos", "length"}
    broken = httpx.post(
        server.predictions_url,
        content=b'{"prompt": "unterminated',
        headers={**server.headers, "Content-Type": "application/json"},
        timeout=60,
    )
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"


def test_a_row_that_ends_early_closes_its_stream_before_its_batch_mates(server):
    """The finish_reason line goes out when the row ends, not when the micro-batch does."""
    short_body = {"prompt": "Short answer", "max_new_tokens": 60, "ignore_eos": True}
    long_body = {"prompt": "Long answer", "max_new_tokens": 400, "ignore_eos": True}
    if server.mode == "static":  # both rows must share one frontend batch: sent together
        with ThreadPoolExecutor(2) as pool:
            short, long = pool.map(lambda body: stream(server, body), [short_body, long_body])
    else:  # the short row joins while the long one streams (sent together, the short one may
        # be admitted and finish before the long one arrives on a busy machine, as CI saw once)
        long_streaming = threading.Event()
        with ThreadPoolExecutor(2) as pool:
            long_future = pool.submit(stream, server, long_body, long_streaming)
            assert long_streaming.wait(60), "the long row never started streaming"
            short = stream(server, short_body)
            long = long_future.result()
    assert (short.status, long.status) == (200, 200)
    (short_done,) = [at for at, line in short.timed_lines if "finish_reason" in line]
    long_lines = long.timed_lines
    if server.mode == "static":  # both rows shared one batch: the short one did not simply run (and end) first
        assert_one_batch(server, [short.request_id, long.request_id])
    assert long_lines[-1][1]["usage"]["completion_tokens"] == 400
    halfway = long_lines[len(long_lines) // 2][0]
    # an ordering of arrivals, not a duration: the long row had half its text still to come
    assert short_done < halfway, (
        f"short row's finish line arrived {short_done - halfway:.3f} s after the long row's halfway line"
    )


def test_greedy_text_is_the_models_own_greedy_generation(server, tiny_model_dir):
    """The batched sampler changes no greedy token: the served text is what transformers'
    `generate(do_sample=False)` makes of the same prompt (EOS suppressed on both sides)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).float().eval()
    prompt, n = "Once upon a time there was", 40
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(
            input_ids=inputs["input_ids"],  # not **inputs: 4.48's tokenizer adds token_type_ids, which generate refuses
            attention_mask=inputs["attention_mask"],
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            suppress_tokens=[tokenizer.eos_token_id],
        )
    want = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    body = {"prompt": prompt, "max_new_tokens": n, "ignore_eos": True, "stream": False}
    got = post(server, body).json()
    assert got["usage"]["completion_tokens"] == n
    assert got["text"] == want


def test_a_seeded_sampled_request_is_answered_alike_alone_and_among_others(server):
    """Seeds keep their meaning through a real TorchServe: the same text whatever the batch-mates."""
    seeded = {"prompt": "A seeded story", "max_new_tokens": 24, "ignore_eos": True, "stream": False}
    seeded |= {"temperature": 0.8, "top_p": 0.9, "seed": 4321}
    alone = post(server, seeded).json()["text"]
    mates = [{"prompt": f"Mate {i}", "max_new_tokens": 30, "temperature": 1.2, "stream": False} for i in range(3)]
    responses = concurrently(server, [mates[0], seeded, mates[1], mates[2]])
    assert [r.status_code for r in responses] == [200] * 4
    assert responses[1].json()["text"] == alone
    other_seed = post(server, {**seeded, "seed": 4322}).json()["text"]
    assert other_seed != alone  # it really samples
