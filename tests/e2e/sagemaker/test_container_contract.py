"""The SageMaker container contract against a real torchserve started as the DLC's toolkit
starts it (its own config file, `--models model=<folder>`), with the environment
scripts/sagemaker/deploy.py sends (TS_CONFIG_FILE -> the archive's sagemaker.properties):
/ping and /invocations without a token, bodies handed over as bytes, streamed NDJSON that
arrives while the model generates, no model registration over HTTP."""

from __future__ import annotations

import io
import json
import time
from importlib.metadata import version

import httpx
import pytest
import yaml
from packaging.version import Version

from scripts.sagemaker import archive as sagemaker_archive
from scripts.sagemaker.common import PROPERTIES_NAME
from scripts.sagemaker.stream import http_payloads, request_body, stream_text
from tests.support.sagemaker_container import CONTAINER_MODEL_CONFIG, start_container
from tests.support.sse import DONE, events

pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/support/asgi_frontend.py)
TORCHSERVE = Version(version("torchserve"))
STREAM_TOKENS = 200  # enough steps that generating them outlasts a network read


@pytest.mark.torchserve_only
def test_torchserve_reads_the_archive_properties_not_the_toolkit_file(container):
    log = container.log_text("ts_log.log")
    assert f"Config file: {container.workdir / PROPERTIES_NAME}" in log
    assert "Allowed Urls: [file:///opt/ml/model/.*]" in log


def test_ping_needs_no_token(container):
    response = httpx.get(f"{container.url}/ping", timeout=10)
    assert response.status_code == 200
    assert response.json()["status"] == "Healthy"
    if getattr(container, "frontend", "torchserve") != "torchserve":
        return  # the ASGI frontend answers /ping itself, open in SageMaker mode
    # answered by the readiness plugin from the model folder's plugins/ (serving/plugins)
    assert "Loading plugin for endpoint ping" in container.log_text("ts_log.log")


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
@pytest.mark.parametrize(("query", "content_type"), [("", "text/plain"), ("?model_name=model", "application/json")])
def test_invocations_plain_bytes_body_streams_ndjson(container, query, content_type):
    # The seed's client: the prompt as bare UTF-8 bytes (sent as application/json), no JSON at all.
    body = b"Today the weather is really nice and I am planning on"
    response = httpx.post(
        f"{container.url}/invocations{query}", content=body, headers={"Content-Type": content_type}, timeout=60
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in response.text.splitlines() if line]
    assert lines[-1]["finish_reason"] in {"eos", "length"}
    assert lines[-1]["usage"]["completion_tokens"] >= 1


def _timed_reads(url: str, body: dict) -> list[tuple[float, bytes]]:
    """Each network read of the streamed response with the moment it arrived."""
    payload, content_type = request_body(body["prompt"], body["max_new_tokens"], plain=False)
    payload = json.dumps({**json.loads(payload), **body}).encode()
    return [(time.perf_counter(), chunk) for chunk in http_payloads(url, payload, content_type)]


def _read_holding(reads: list[tuple[float, bytes]], needle: bytes) -> int:
    """Index of the read in which `needle` was complete."""
    received = b""
    for index, (_, chunk) in enumerate(reads):
        received += chunk
        if needle in received:
            return index
    raise AssertionError(f"{needle!r} never arrived")


def test_invocations_stream_lines_while_generating(container):
    """The first line reaches the client in an earlier network read than the last line, which
    the server writes only when generation has ended: the text is streamed, not buffered."""
    body = {"prompt": "Once upon a time", "max_new_tokens": STREAM_TOKENS, "ignore_eos": True, "temperature": 0}
    reads = _timed_reads(container.url, body)
    lines = b"".join(chunk for _, chunk in reads).splitlines()
    final = json.loads(lines[-1])
    assert final["finish_reason"] == "length" and final["usage"]["completion_tokens"] == STREAM_TOKENS
    first_read = _read_holding(reads, lines[0] + b"\n")
    final_read = _read_holding(reads, lines[-1])
    assert first_read < final_read, f"all {len(lines)} lines came in read {final_read}: buffered, not streamed"
    assert reads[first_read][0] < reads[final_read][0]


def test_invocations_stream_choice(container):
    body = {"inputs": "Once upon a time", "parameters": {"max_new_tokens": 12, "ignore_eos": True}, "stream": False}
    response = httpx.post(f"{container.url}/invocations?model_name=model", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    result = response.json()
    assert result["finish_reason"] == "length" and result["usage"]["completion_tokens"] == 12
    streamed = io.StringIO()
    payload, content_type = request_body("Once upon a time", 12, plain=False)
    payload = json.dumps({**json.loads(payload), "ignore_eos": True, "temperature": 0}).encode()
    last = stream_text(http_payloads(container.url, payload, content_type), streamed)
    assert last["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 12
    assert streamed.getvalue() == result["text"]


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_invocations_bad_body_is_a_400(container):
    response = httpx.post(f"{container.url}/invocations", content=b"\xff\xfe", timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_openai_body_on_invocations_streams_sse(container):
    """What a SageMaker client can send: /invocations only, the body's shape picks the OpenAI answer."""
    body = {"model": "model", "prompt": "Today", "max_tokens": 6, "stream": True, "ignore_eos": True}
    response = httpx.post(f"{container.url}/invocations", json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    parsed = events(response.text)
    assert parsed[-1] == DONE and parsed[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.torchserve_only
@pytest.mark.skipif(
    TORCHSERVE < Version("0.12"), reason="TorchServe 0.11 passes no url_path: only the body's shape picks the route"
)
def test_openai_route_serves_undecoded_bodies(container):
    body = {"prompt": "Today", "max_tokens": 6, "stream": True, "ignore_eos": True}
    url = f"{container.predictions_url}/1.0/v1/completions"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200
    parsed = events(response.text)
    assert parsed[-1] == DONE and parsed[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.torchserve_only
@pytest.mark.parametrize("archive_url", ["https://example.com/models/evil.mar", "file:///tmp/evil.mar"])
def test_model_registration_over_http_is_refused(container, archive_url):
    """0.12+: the model API is off (enable_model_api=false), so 405 before anything else.
    0.11 has no such switch (the API answers); allowed_urls, narrowed to the model folder,
    refuses the URL before any download: 404 with TorchServe's allowed-URL message."""
    url = f"http://127.0.0.1:{container.management_port}/models"
    response = httpx.post(url, params={"url": archive_url}, timeout=30)
    if TORCHSERVE >= Version("0.12"):
        assert response.status_code == 405, response.text
    else:
        assert response.status_code == 404, response.text
        assert f"Given URL {archive_url} does not match any allowed URL(s)" in response.json()["message"]


def test_a_sagemaker_archive_answers_as_the_container_runs_it(tmp_path, tiny_model_dir):
    """The folder `make sagemaker-upload` sends, built with a CPU config (the hf backend: no
    Inferentia here), started as the DLC's toolkit starts /opt/ml/model with TS_CONFIG_FILE."""
    config = tmp_path / "cpu-config.yaml"
    config.write_text(yaml.safe_dump(CONTAINER_MODEL_CONFIG))
    folder = sagemaker_archive.build(tiny_model_dir, config, "llama", tmp_path / "build")
    (tmp_path / "ts").mkdir()
    server = start_container(tmp_path / "ts", folder)
    try:
        body = {"prompt": "Today", "max_new_tokens": 4, "ignore_eos": True, "stream": False}
        response = httpx.post(f"{server.url}/invocations", json=body, timeout=60)
    finally:
        server.stop()
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 4
