"""What only the ASGI frontend (handler/frontend/) has: its strict outer surface (the key, 401,
405, 413, framing, no server header), its own base URLs (/v1, /generate), a disconnect that frees
the slot, /ping gated on loading, and SIGTERM draining the streams in flight. The routes it
shares with TorchServe are tested against both (the modules marked both_frontends)."""

from __future__ import annotations

import http.client
import json
import re
import signal
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import huggingface_hub.constants
import openai
import pytest
from huggingface_hub import InferenceClient

from handler.failpoints import WARMUP_ENV
from tests.e2e.conftest import E2E_MODEL_CONFIG
from tests.support.asgi_frontend import AsgiFrontend, start_asgi_frontend
from tests.support.sse import DONE, events

CONTENT_JSON = {"Content-Type": "application/json"}
BODY_LIMIT = 4096
N_SLOTS = 2
BATCH_SIZE, JOB_QUEUE = 4, 2  # at most 6 requests in flight, then a fast 503
CONFIG = {
    **E2E_MODEL_CONFIG,
    "batchSize": BATCH_SIZE,
    "jobQueueSize": JOB_QUEUE,
    "scheduler": {"mode": "continuous", "n_slots": N_SLOTS},
}


@pytest.fixture(scope="module")
def frontend(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsgiFrontend]:
    server = start_asgi_frontend(
        tmp_path_factory.mktemp("asgi-edges"),
        tiny_model_dir,
        CONFIG,
        extra_args=("--max-body-bytes", str(BODY_LIMIT), "--body-timeout-s", "2"),
    )
    try:
        yield server
    finally:
        server.stop()


def generate(server: AsgiFrontend, **extra) -> dict:
    return {"prompt": "Once upon a time", "max_new_tokens": 4, "stream": False, **extra}


def raw_exchange(server: AsgiFrontend, request: bytes) -> bytes:
    """Send bytes as they are; everything the server answers until it closes (or 10 s of silence)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as connection:
        connection.sendall(request)
        received = b""
        try:
            while chunk := connection.recv(65536):
                received += chunk
        except TimeoutError:
            received += b"<no close>"
    return received


# -- the key ---------------------------------------------------------------------------
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", "Basic abc", "Bearer"])
def test_a_missing_or_wrong_key_is_a_401_in_json(frontend: AsgiFrontend, authorization: str | None):
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in (("POST", "/predictions/llama"), ("GET", "/ping"), ("GET", "/metrics"), ("GET", "/nowhere")):
        response = httpx.request(method, frontend.url + path, json=generate(frontend), headers=headers, timeout=30)
        assert response.status_code == 401, (path, response.text)
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["www-authenticate"] == "Bearer"


def test_the_key_file_is_read_again_when_it_changes(frontend: AsgiFrontend):
    old = frontend.headers
    assert httpx.get(f"{frontend.url}/ping", headers=old, timeout=30).status_code == 200
    frontend.key_file.write_text("a-rotated-key-of-enough-length\n")
    try:
        assert httpx.get(f"{frontend.url}/ping", headers=old, timeout=30).status_code == 401
        assert httpx.get(f"{frontend.url}/ping", headers=frontend.headers, timeout=30).status_code == 200
    finally:
        frontend.key_file.write_text(old["Authorization"].removeprefix("Bearer ") + "\n")
    assert httpx.get(f"{frontend.url}/ping", headers=old, timeout=30).status_code == 200


# -- the outer surface -----------------------------------------------------------------
def test_no_server_header(frontend: AsgiFrontend):
    response = httpx.post(frontend.predictions_url, json=generate(frontend), headers=frontend.headers, timeout=30)
    assert response.status_code == 200
    assert "server" not in response.headers
    assert response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", "/predictions/llama"), ("DELETE", "/v1/completions"), ("GET", "/generate"), ("POST", "/ping")],
)
def test_other_methods_are_a_405_in_json(frontend: AsgiFrontend, method: str, path: str):
    response = httpx.request(method, frontend.url + path, headers=frontend.headers, timeout=30)
    assert response.status_code == 405, response.text
    assert response.json()["error"]["param"] == "method"
    assert response.headers["allow"]


def test_unknown_paths_and_models_are_a_404_in_json(frontend: AsgiFrontend):
    for path in ("/nowhere", "/predictions/another-model", "/predictions/llama/1.0/v1/unknown"):
        response = httpx.post(frontend.url + path, json=generate(frontend), headers=frontend.headers, timeout=30)
        assert response.status_code == 404, (path, response.text)
        assert response.json()["error"]["type"] == "not_found_error"


def test_a_body_over_the_limit_is_a_413_in_json(frontend: AsgiFrontend):
    big = json.dumps(generate(frontend, prompt="x" * BODY_LIMIT)).encode()
    response = httpx.post(frontend.predictions_url, content=big, headers=frontend.headers, timeout=30)
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"

    def chunked() -> Iterator[bytes]:  # no Content-Length: refused as the bytes pass the limit
        yield big[:1000]
        yield big[1000:]

    response = httpx.post(frontend.predictions_url, content=chunked(), headers=frontend.headers, timeout=30)
    assert response.status_code == 413 and response.json()["error"]["param"] == "body"


@pytest.mark.parametrize("lengths", [["-5"], ["5", "7"], ["5, 7"]], ids=["negative", "conflicting", "list"])
def test_malformed_framing_is_a_400_at_once(frontend: AsgiFrontend, lengths: list[str]):
    head = f"POST /predictions/llama HTTP/1.1\r\nHost: x\r\nAuthorization: {frontend.headers['Authorization']}\r\n"
    head += "".join(f"Content-Length: {value}\r\n" for value in lengths)
    received = raw_exchange(frontend, (head + "\r\nhello").encode())
    assert received.startswith(b"HTTP/1.1 400 "), received[:200]
    assert not received.endswith(b"<no close>"), "the connection was held open"


def test_a_slow_body_is_a_408(frontend: AsgiFrontend):
    head = f"POST /predictions/llama HTTP/1.1\r\nHost: x\r\nAuthorization: {frontend.headers['Authorization']}\r\n"
    received = raw_exchange(frontend, (head + "Content-Length: 100\r\n\r\n{").encode())  # 99 bytes never come
    assert received.startswith(b"HTTP/1.1 408 "), received[:200]
    assert b'"param":"body"' in received


def test_ping_needs_the_key_outside_sagemaker_mode(frontend: AsgiFrontend):
    assert httpx.get(f"{frontend.url}/ping", timeout=30).status_code == 401
    assert httpx.post(f"{frontend.url}/invocations", json=generate(frontend), timeout=30).status_code == 401


# -- its own base URLs -----------------------------------------------------------------
def test_openai_client_on_the_v1_base_url(frontend: AsgiFrontend):
    client = openai.OpenAI(base_url=f"{frontend.url}/v1", api_key=frontend.key, max_retries=0, timeout=60)
    assert [m.id for m in client.models.list()] == ["llama"]
    stream = client.chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Tell me a story."}],
        max_completion_tokens=12,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model="llama", prompt="x", n=9)
    assert excinfo.value.body["param"] == "n"


def test_tgi_client_on_the_bare_generate_route(frontend: AsgiFrontend, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # our own server, not the hub
    client = InferenceClient(base_url=f"{frontend.url}/generate", api_key=frontend.key, timeout=60)
    text = client.text_generation("Once upon a time", max_new_tokens=8)
    assert "".join(client.text_generation("Once upon a time", max_new_tokens=8, stream=True)) == text
    response = httpx.post(
        f"{frontend.url}/generate_stream",
        json={"inputs": "Once", "parameters": {"max_new_tokens": 3}},
        headers=frontend.headers,
        timeout=60,
    )
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")


def test_openai_sse_on_the_torchserve_style_path(frontend: AsgiFrontend):
    body = {"model": "llama", "prompt": "Today", "max_tokens": 5, "stream": True, "ignore_eos": True}
    url = f"{frontend.predictions_url}/1.0/v1/completions"
    response = httpx.post(url, json=body, headers=frontend.headers, timeout=60)
    parsed = events(response.text)
    assert parsed[-1] == DONE and parsed[-2]["choices"][0]["finish_reason"] == "length"


# -- the engine in process -------------------------------------------------------------
def metric(server: AsgiFrontend, name: str) -> float:
    text = httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=30).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_disconnect_frees_the_slot_for_the_next_request(frontend: AsgiFrontend):
    """Both slots held by endless streams; their clients leave after the first chunks; a third
    request then gets a slot and is answered in full, and the engine logged both cancellations."""
    cancelled_before = metric(frontend, "llm_cancelled_requests_total")
    body = {"prompt": "Once upon a time", "max_new_tokens": 600, "ignore_eos": True}
    streams = [
        httpx.stream("POST", frontend.predictions_url, json=body, headers=frontend.headers, timeout=60)
        for _ in range(N_SLOTS)
    ]
    readers = []  # held: dropping a reader closes its connection
    for stream in streams:
        response = stream.__enter__()
        assert response.status_code == 200
        readers.append(response.iter_raw())
        next(readers[-1])  # generating
    assert metric(frontend, "llm_slots_occupied") == N_SLOTS
    for stream in streams:
        stream.__exit__(None, None, None)  # the client closes the connection mid-stream
    after = httpx.post(frontend.predictions_url, json=generate(frontend), headers=frontend.headers, timeout=60)
    assert after.status_code == 200 and after.json()["usage"]["completion_tokens"] == 4
    deadline = time.monotonic() + 30
    while metric(frontend, "llm_cancelled_requests_total") < cancelled_before + N_SLOTS:
        assert time.monotonic() < deadline, "the disconnects were not seen"
        time.sleep(0.2)
    assert frontend.log_text().count("cancelled by its client") >= N_SLOTS


def test_past_batch_size_plus_job_queue_size_a_fast_503(frontend: AsgiFrontend):
    """As TorchServe bounds its queue: batchSize + jobQueueSize requests in flight (2 decoding, 4
    waiting for a slot), then a 503 in JSON at once; a slot freed, requests are taken again."""
    body = {"prompt": "Once upon a time", "max_new_tokens": 600, "ignore_eos": True}
    streams = [
        httpx.stream("POST", frontend.predictions_url, json=body, headers=frontend.headers, timeout=60)
        for _ in range(BATCH_SIZE + JOB_QUEUE)
    ]
    try:
        for stream in streams[:N_SLOTS]:  # decoding: their first chunks came
            response = stream.__enter__()
            assert response.status_code == 200
        with ThreadPoolExecutor(JOB_QUEUE + BATCH_SIZE - N_SLOTS) as pool:  # waiting: no status line yet
            waiting = [pool.submit(stream.__enter__) for stream in streams[N_SLOTS:]]
            deadline = time.monotonic() + 30
            while metric(frontend, "llm_requests_waiting") < len(waiting):
                assert time.monotonic() < deadline, "the waiting requests did not reach the engine"
                time.sleep(0.1)
            full = httpx.post(frontend.predictions_url, json=generate(frontend), headers=frontend.headers, timeout=30)
            assert full.status_code == 503, full.text
            assert full.json()["error"]["type"] == "service_unavailable"
            streams[0].__exit__(None, None, None)  # one client leaves: its slot goes to a waiting request
            for future in waiting:
                future.result(timeout=60)
    finally:
        for stream in streams:
            stream.__exit__(None, None, None)
    deadline = time.monotonic() + 30
    while metric(frontend, "llm_requests_in_flight") > 0:
        assert time.monotonic() < deadline, "the requests were not all aborted"
        time.sleep(0.2)
    after = httpx.post(frontend.predictions_url, json=generate(frontend), headers=frontend.headers, timeout=60)
    assert after.status_code == 200


# -- lifecycle -------------------------------------------------------------------------
def test_ping_waits_for_the_model_and_sigterm_drains_the_streams(tiny_model_dir: Path, tmp_path: Path):
    """Started as a SageMaker container starts it (handler/frontend/sagemaker.py: `serve`, the model data
    in a stand-in /opt/ml/model): /ping and /invocations need no key, the other routes do; /ping is 503
    while the model loads. At SIGTERM the drain starts: /ping is 503, a new request on a kept-alive
    connection gets a 503 in JSON, the stream and the request in flight run to their end, then the
    process exits."""
    server = start_asgi_frontend(
        tmp_path, tiny_model_dir, CONFIG, env={WARMUP_ENV: "3"}, model_name="model", sagemaker_entry=True, wait=False
    )
    try:
        statuses = []
        deadline = time.monotonic() + 120
        while not statuses or statuses[-1] != 200:
            assert time.monotonic() < deadline and server.process.poll() is None, server.log_text()[-2000:]
            try:
                statuses.append(httpx.get(f"{server.url}/ping", timeout=5).status_code)
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        assert 503 in statuses, statuses  # answered while loading, not refused
        assert httpx.get(f"{server.url}/v1/models", timeout=5).status_code == 401  # the key file the entry wrote
        assert httpx.get(f"{server.url}/v1/models", headers=server.headers, timeout=5).status_code == 200

        kept = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)  # one keep-alive connection
        kept.request("GET", "/ping")
        assert kept.getresponse().read() and kept.sock is not None
        # a request in flight at SIGTERM whose body is still coming: it holds the drain open
        late = json.dumps(generate(server)).encode()
        holder = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        head = "POST /invocations HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        head += f"Content-Length: {len(late)}\r\n\r\n"
        holder.sendall(head.encode() + late[:5])

        body = {"prompt": "Once upon a time", "max_new_tokens": 300, "ignore_eos": True}
        with httpx.stream("POST", f"{server.url}/invocations", json=body, timeout=60) as response:
            assert response.status_code == 200
            chunks = response.iter_raw()
            received = next(chunks)
            server.process.send_signal(signal.SIGTERM)  # SIGTERM mid-stream
            ping = httpx.get(f"{server.url}/ping", timeout=5)
            while ping.status_code == 200:  # until the server has taken the signal
                assert time.monotonic() < deadline
                ping = httpx.get(f"{server.url}/ping", timeout=5)
            draining = {"status": "Draining", "message": "the server is draining"}  # as TorchServe's plugin says
            assert ping.status_code == 503 and ping.json() == draining, ping.text
            kept.request("POST", "/invocations", body=json.dumps(generate(server)), headers=CONTENT_JSON)
            refused = kept.getresponse()
            assert refused.status == 503 and refused.getheader("Connection") == "close"
            assert "the server is draining" in json.loads(refused.read())["error"]["message"]
            received += b"".join(chunks)
        last = json.loads(received.splitlines()[-1])
        assert last["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 300
        holder.sendall(late[5:])  # admitted before the drain: served
        assert holder.recv(65536).startswith(b"HTTP/1.1 200 ")
        holder.close()
        # uvicorn ends by re-raising the signal it caught, after its graceful shutdown
        assert server.process.wait(60) in (0, -signal.SIGTERM)
        assert "Application shutdown complete" in server.log_text()
    finally:
        server.stop()
