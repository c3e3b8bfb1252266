"""HTTP edges through both frontends: what the handler answers itself (a BOM before JSON, a
compressed or form-encoded body), and, side by side, the edges only the frontend controls:
TorchServe's answers pinned as they are today (docs/operations.md says what a deployer does about
each; a change in TorchServe shows here), the ASGI frontend's as docs/frontends.md gives them."""

from __future__ import annotations

import gzip
import json
import socket

import httpx
import pytest

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.asgi_frontend import AsgiFrontend
from tests.support.torchserve_process import TorchServe

BODY = {"prompt": "Today the weather is", "max_new_tokens": 5, "ignore_eos": True, "stream": False}
OVER_THE_BODY_LIMIT = 6_553_500 + 10  # TorchServe's max_request_size default, the ASGI frontend's too

pytestmark = pytest.mark.both_frontends


@pytest.fixture(scope="module")
def served(probed_server: TorchServe | AsgiFrontend) -> TorchServe | AsgiFrontend:
    return probed_server


def on_asgi(served: TorchServe | AsgiFrontend) -> bool:
    return isinstance(served, AsgiFrontend)


def post(served: TorchServe | AsgiFrontend, content: bytes, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(served.predictions_url, content=content, headers={**served.headers, **headers}, timeout=30)


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_a_byte_order_mark_before_json_is_read_as_json(served):
    reply = post(served, b"\xef\xbb\xbf" + json.dumps(BODY).encode(), {"Content-Type": "application/json"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 5  # max_new_tokens and stream were read


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
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


# -- what only the frontend decides ------------------------------------------------------
def test_frontend_a_body_over_the_limit_is_a_413(served):
    reply = post(served, b"x" * OVER_THE_BODY_LIMIT, {"Content-Type": "text/plain"})
    assert reply.status_code == 413
    if on_asgi(served):
        assert reply.json()["error"]["param"] == "body"
    else:
        assert reply.content == b""  # TorchServe: an empty body


def test_frontend_a_negative_content_length(served):
    with socket.create_connection(("127.0.0.1", served.inference_port), timeout=3) as conn:
        conn.sendall(
            f"POST /predictions/{served.model_name} HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n".encode()
        )
        if on_asgi(served):
            assert conn.recv(1024).startswith(b"HTTP/1.1 400 ")  # at once
        else:
            with pytest.raises(socket.timeout):
                conn.recv(1024)  # held open, nothing written: put a proxy with client timeouts in front


def test_frontend_what_answers_without_a_key(served):
    options = httpx.request("OPTIONS", f"{served.url}/", timeout=30)
    wrong = httpx.get(f"{served.url}/ping", headers={"Authorization": "Bearer wrong"}, timeout=30)
    if on_asgi(served):
        metrics = httpx.get(f"{served.url}/metrics", timeout=30)
        assert (options.status_code, metrics.status_code, wrong.status_code) == (401, 401, 401)
        assert "version" not in options.text.lower()
        return
    if not has_secure_defaults():
        pytest.skip("TorchServe 0.11 has no token authorization")
    assert options.status_code == 200 and "openapi" in options.text  # its OpenAPI document, with its version
    metrics = httpx.get(f"http://127.0.0.1:{served.metrics_port}/metrics", timeout=30)
    assert metrics.status_code == 200
    assert wrong.status_code == 400  # not 401


def test_frontend_internal_headers_in_a_stream(served):
    body = {**BODY, "stream": True}
    with httpx.stream("POST", served.predictions_url, json=body, headers=served.headers, timeout=30) as reply:
        assert reply.status_code == 200
        # TorchServe's frontend-to-worker flag reaches the client; the ASGI frontend has no such protocol
        assert reply.headers.get("ts_stream_next") == (None if on_asgi(served) else "true")
        reply.read()
