"""SIGTERM on the ASGI frontend: a drain before uvicorn's own shutdown.

uvicorn alone, on SIGTERM, stops listening and closes every idle keep-alive connection at once, so
a client that sends its next request on such a connection just then sees it closed with no answer.
Here the first SIGTERM (or Ctrl-C) starts a drain instead: the server keeps listening, every new
request gets a fast 503 in JSON (`the server is draining`) with `Connection: close`, `/ping` answers
503 (a load balancer takes the instance out), and the requests in flight (streams included) run on.
Once none is left, or `drain_s` has passed, uvicorn's graceful shutdown runs (a short grace, then
what is still running is cancelled): within SageMaker's 30 s between SIGTERM and SIGKILL.
A second signal skips the drain.
"""

from __future__ import annotations

import json
import time
from types import FrameType
from typing import Any

import uvicorn

from handler.errors import ServiceUnavailable, to_http

DRAINING = "the server is draining"


class Drain:
    def __init__(self, drain_s: float) -> None:
        self.drain_s = drain_s
        self.started_at: float | None = None
        self.in_flight = 0  # HTTP requests being answered (not the 503s of the drain)

    @property
    def started(self) -> bool:
        return self.started_at is not None

    def begin(self) -> None:
        if self.started_at is None:
            self.started_at = time.monotonic()

    def done(self) -> bool:
        """Nothing left in flight, or out of time."""
        assert self.started_at is not None
        return self.in_flight == 0 or time.monotonic() - self.started_at >= self.drain_s


class DrainGate:
    """ASGI middleware, outermost: counts the requests in flight; while draining, answers new ones 503."""

    def __init__(self, app: Any, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.started:
            await self._refuse(scope, send)
            return
        self.drain.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.in_flight -= 1

    async def _refuse(self, scope: Any, send: Any) -> None:
        if scope["path"] == "/ping":
            body: dict[str, Any] = {"status": "Draining", "message": DRAINING}  # as TorchServe's plugin
        else:
            body = to_http(ServiceUnavailable(f"{DRAINING}; retry on another instance", "model")).body
        payload = json.dumps(body).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the drain before its shutdown (its tick, every 0.1 s, watches the drain)."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self.drain.started
        super().handle_exit(sig, frame)  # records the signal: uvicorn re-raises it once stopped
        if first and not self.force_exit:
            self.drain.begin()
            self.should_exit = False  # not yet: on_tick ends the drain

    async def on_tick(self, counter: int) -> bool:
        if self.drain.started and not self.should_exit and self.drain.done():
            self.should_exit = True
        return await super().on_tick(counter)
