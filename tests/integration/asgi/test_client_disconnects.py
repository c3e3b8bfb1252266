"""A client that disconnects while it sends its body (issue 42, item 4): one line in the log, never
an "Exception in ASGI application" traceback, on every body-reading route; the app serves on."""

from __future__ import annotations

import logging

import pytest

from tests.support.asgi_inprocess import InProcessFrontend

PATHS = ["/v1/completions", "/v1/chat/completions", "/generate", "/predictions/llama", "/invocations"]


async def send_half_then_leave(frontend: InProcessFrontend, path: str) -> list[dict]:
    """An HTTP request whose body stops half-way with a disconnect; what the app sent back."""
    messages = iter(
        [
            {"type": "http.request", "body": b'{"model": "llama", "prompt": "half a bo', "more_body": True},
            {"type": "http.disconnect"},
        ]
    )

    async def receive() -> dict:
        return next(messages, {"type": "http.disconnect"})

    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"asgi.in-process"),
            (b"content-type", b"application/json"),
            (b"content-length", b"200"),
            (b"authorization", f"Bearer {frontend.key}".encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("asgi.in-process", 80),
    }
    await frontend.app(scope, receive, send)
    return sent


@pytest.mark.parametrize("path", PATHS)
def test_a_client_leaving_mid_body_is_one_quiet_line(frontend: InProcessFrontend, caplog, path):
    with caplog.at_level(logging.INFO):
        for _ in range(20):
            sent = frontend.run(send_half_then_leave(frontend, path))
            assert [m.get("status") for m in sent if m["type"] == "http.response.start"] in ([499], [])
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert errors == []
    left = [r for r in caplog.records if "left while sending its body" in r.getMessage()]
    assert len(left) == 20
    ok = frontend.post("/v1/completions", json={"model": "llama", "prompt": "still serving", "max_tokens": 4})
    assert ok.status_code == 200
