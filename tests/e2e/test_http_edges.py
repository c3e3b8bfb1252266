"""HTTP edges through a real TorchServe: what the handler answers itself (a BOM before JSON, a
compressed or form-encoded body), and, pinned as they are today, the edges only TorchServe's
frontend controls (docs/operations.md says what a deployer does about each)."""

from __future__ import annotations

import gzip
import json
import socket

import httpx
import pytest

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.torchserve_process import TorchServe

BODY = {"prompt": "Today the weather is", "max_new_tokens": 5, "ignore_eos": True, "stream": False}


@pytest.fixture(scope="module")
def served(continuous_server: TorchServe) -> TorchServe:
    return continuous_server


def post(served: TorchServe, content: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(served.predictions_url, content=content, headers={**served.headers, **headers}, timeout=30)


def test_a_byte_order_mark_before_json_is_read_as_json(served):
    reply = post(served, b"\xef\xbb\xbf" + json.dumps(BODY).encode(), {"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 5  # max_new_tokens and stream were read


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"Content-Type": "application/x-www-form-urlencoded"}, "Content-Type"),
        ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, "Content-Encoding"),
    ],
    ids=["form", "gzip"],
)
def test_a_body_in_a_form_the_handler_cannot_read_is_a_415_naming_the_header(served, headers, param):
    content = json.dumps(BODY).encode()
    reply = post(served, gzip.compress(content) if "Content-Encoding" in headers else content, headers)
    assert reply.status_code == 415, reply.text
    assert reply.json()["error"]["param"] == param


# -- what only TorchServe's frontend decides (pinned: a change in TorchServe shows here) ----------
def test_frontend_a_body_over_max_request_size_gets_an_empty_413(served):
    reply = post(served, b"x" * (1024 * 1024 + 10), {"Content-Type": "text/plain"})
    assert reply.status_code == 413 and reply.content == b""


def test_frontend_a_negative_content_length_gets_no_answer(served):
    with socket.create_connection(("127.0.0.1", served.inference_port), timeout=3) as conn:
        conn.sendall(
            f"POST /predictions/{served.model_name} HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".encode()
        )
        with pytest.raises(socket.timeout):
            conn.recv(1024)  # held open, nothing written: put a proxy with client timeouts in front


@pytest.mark.skipif(not has_secure_defaults(), reason="TorchServe 0.11 has no token authorization")
def test_frontend_what_answers_without_a_key(served):
    options = httpx.request("OPTIONS", f"{served.url}/", timeout=30)
    assert options.status_code == 200 and "openapi" in options.text  # its OpenAPI document, with its version
    metrics = httpx.get(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=30)
    assert metrics.status_code == 200
    wrong = httpx.get(f"{served.url}/ping", headers={"Authorization": "Bearer wrong"}, timeout=30)
    assert wrong.status_code == 400  # not 401


def test_frontend_a_stream_carries_the_internal_ts_stream_next_header(served):
    body = {**BODY, "stream": True}
    with httpx.stream("POST", served.predictions_url, json=body, headers=served.headers, timeout=30) as reply:
        assert reply.status_code == 200
        assert reply.headers.get("ts_stream_next") == "true"
        reply.read()
