"""The SageMaker container contract against a real torchserve configured as the DLC runs
it (the toolkit's config file + the TS_* environment scripts/sagemaker_deploy.py sends):
/ping and /invocations without a token, bodies handed over as bytes, model API off."""

from __future__ import annotations

import io
import json

import httpx
import pytest

from scripts.sagemaker_stream import http_payloads, request_body, stream_text
from tests.openai.sse import DONE, events

pytestmark = pytest.mark.e2e


def test_ping_needs_no_token(container):
    response = httpx.get(f"{container.url}/ping", timeout=10)
    assert response.status_code == 200
    assert response.json()["status"] == "Healthy"


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


def test_invocations_bad_body_is_a_400(container):
    response = httpx.post(f"{container.url}/invocations", content=b"\xff\xfe", timeout=60)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "body"


def test_openai_route_serves_undecoded_bodies(container):
    body = {"prompt": "Today", "max_tokens": 6, "stream": True, "ignore_eos": True}
    url = f"{container.predictions_url}/1.0/v1/completions"
    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200
    parsed = events(response.text)
    assert parsed[-1] == DONE and parsed[-2]["choices"][0]["finish_reason"] == "length"


def test_model_api_stays_off(container):
    response = httpx.post(f"http://127.0.0.1:{container.management_port}/models?url=anything.mar", timeout=10)
    assert response.status_code == 405
