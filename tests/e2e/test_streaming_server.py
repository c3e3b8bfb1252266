"""A real torchserve process, real HTTP, concurrent clients."""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.e2e.conftest import FAILPOINT_MARKER


def stream(server, body: dict) -> tuple[int, list[tuple[float, str]], httpx.Headers]:
    """POST and read the body chunk by chunk, noting when each chunk arrived."""
    started = time.perf_counter()
    arrivals = []
    with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
        for chunk in response.iter_raw():
            arrivals.append((time.perf_counter() - started, chunk.decode("utf-8", errors="replace")))
        return response.status_code, arrivals, response.headers


def ndjson(arrivals) -> list[dict]:
    return [json.loads(line) for line in "".join(text for _, text in arrivals).splitlines() if line]


def post(server, body) -> httpx.Response:
    return httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60)


def test_chunks_arrive_while_generating(server):
    body = {"prompt": "Once upon a time", "max_new_tokens": 400, "ignore_eos": True}
    status, arrivals, headers = stream(server, body)
    assert status == 200
    assert headers["content-type"] == "application/x-ndjson"
    lines = ndjson(arrivals)
    assert lines[-1]["finish_reason"] == "length"
    assert lines[-1]["usage"]["completion_tokens"] == 400
    first, last = arrivals[0][0], arrivals[-1][0]
    assert len(arrivals) > 20
    assert first < 0.5 * last, f"first chunk at {first:.3f}s, last at {last:.3f}s: not streamed"


def test_stream_concatenation_equals_non_streamed_text(server):
    body = {"prompt": "Streaming sends each piece of text", "max_new_tokens": 60, "ignore_eos": True}
    _, arrivals, _ = stream(server, body)
    whole = post(server, {**body, "stream": False})
    assert whole.status_code == 200
    assert whole.headers["content-type"] == "application/json"
    lines = ndjson(arrivals)
    assert "".join(line["text"] for line in lines) == whole.json()["text"]
    assert lines[-1]["usage"] == whole.json()["usage"]


def concurrently(server, bodies):
    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(lambda b: post(server, b), bodies))


def test_concurrent_requests_share_one_frontend_batch(server):
    bodies = [{"prompt": f"Request number {i}", "max_new_tokens": 16, "stream": False} for i in range(4)]
    responses = concurrently(server, bodies)
    assert [r.status_code for r in responses] == [200] * 4
    ids = {r.headers["x-request-id"] for r in responses}
    batches = re.findall(r"frontend batch of (\d+) request\(s\): (\S+)", server.log_text())
    assert any(n == "4" and set(listed.split(",")) == ids for n, listed in batches), batches[-5:]


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
    assert failed.status_code == 500
    assert failed.json()["error"]["type"] == "server_error"
    status, arrivals, _ = stream(server, {"prompt": f"{FAILPOINT_MARKER} go", "max_new_tokens": 50, "ignore_eos": True})
    assert status == 200 and "error" in ndjson(arrivals)[-1]
    after = post(server, {"prompt": "Are you still there?", "max_new_tokens": 8, "stream": False})
    assert after.status_code == 200
    assert after.json()["finish_reason"] in {"eos", "length"}


def test_plain_text_and_sagemaker_style_bodies(server):
    plain = httpx.post(
        server.predictions_url,
        content=b"Today the weather is really nice and",
        headers={**server.headers, "Content-Type": "application/json"},  # as the seed's SageMaker client sends it
        timeout=60,
    )
    assert plain.status_code == 200
    assert ndjson([(0, plain.text)])[-1]["finish_reason"] in {"eos", "length"}
    broken = httpx.post(
        server.predictions_url,
        content=b'{"prompt": "unterminated',
        headers={**server.headers, "Content-Type": "application/json"},
        timeout=60,
    )
    assert broken.status_code == 400 and broken.json()["error"]["param"] == "body"


def test_a_row_that_ends_early_closes_its_stream_before_its_batch_mates(server):
    """The finish_reason line goes out when the row ends, not when the micro-batch does."""
    bodies = [
        {"prompt": "Short answer", "max_new_tokens": 4, "ignore_eos": True},
        {"prompt": "Long answer", "max_new_tokens": 400, "ignore_eos": True},
    ]

    def finish_line_time(body) -> float:
        with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
            for line in response.iter_lines():
                if line and "finish_reason" in json.loads(line):
                    return time.perf_counter()
        raise AssertionError("no finish_reason line")

    started = time.perf_counter()
    with ThreadPoolExecutor(2) as pool:
        short_done, long_done = (t - started for t in pool.map(finish_line_time, bodies))
    batches = re.findall(r"frontend batch of (\d+) request", server.log_text())
    assert "2" in batches  # both rows shared one batch: the short one did not simply go first
    assert short_done < 0.5 * long_done, f"short finished at {short_done:.3f}s, long at {long_done:.3f}s"
