"""One generation request as an ASGI response: the core's `ResponseMachine`
(handler/core/response.py) decides what to send; this carries it as `http.response.*`
messages. A client that disconnects (before or during the stream) releases the request: the
engine frees its slots at its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from handler.core.preparation import Work
from handler.core.replies import STREAM_HEADERS, STREAMED_TYPES
from handler.core.response import News, Output, ResponseMachine
from handler.frontend.body import disconnected
from handler.frontend.bridge import EngineBridge
from handler.frontend.metrics import FrontendMetrics

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ClientGone(Exception):
    """The client closed the connection."""


def response_headers(content_type: str, request_id: str, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode()), (b"x-request-id", request_id.encode())]
    if content_type in STREAMED_TYPES:
        headers += [(k.lower().encode(), v.encode()) for k, v in STREAM_HEADERS.items()]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return headers


async def send_whole(
    send: Send, status: int, content_type: str, request_id: str, body: str, more: tuple[tuple[str, str], ...] = ()
) -> None:
    data = body.encode("utf-8", errors="replace")
    headers = response_headers(content_type, request_id, len(data)) + [
        (k.lower().encode(), v.encode()) for k, v in more
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class GenerationResponse:
    """The ASGI response of one prepared request (`work`, its error or reply already decided)."""

    def __init__(self, bridge: EngineBridge, metrics: FrontendMetrics, work: Work, route: str) -> None:
        self.bridge = bridge
        self.metrics = metrics
        self.work = work
        self.route = route
        self.machine = ResponseMachine(work, metrics.serving)
        self._started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 0
        gone = asyncio.ensure_future(disconnected(receive))
        submitted = False
        try:
            output = self.machine.immediate()
            if output is None:
                queue, submitted = self.bridge.submit(self.work), True
                while output is None or not output.end:
                    if output is not None:
                        await self._send(send, output)
                    output = self.machine.feed(await _next(queue, gone))
            status = await self._send(send, output)
        except ClientGone:
            status = 499  # nginx's name for it: the client closed the request
        finally:
            gone.cancel()
            if submitted and self.bridge.release(self.work) and not self.machine.done:
                self.metrics.cancelled()
            self.metrics.response(self.route, status)

    async def _send(self, send: Send, output: Output) -> int:
        """Carry one output; the response's status."""
        if output.whole:
            await send_whole(
                send, output.status, output.content_type, self.work.request_id, output.body, output.headers
            )
            return output.status
        if not self._started:
            headers = response_headers(output.content_type, self.work.request_id)
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            self._started = True
        body = output.body.encode("utf-8", errors="replace")
        await send({"type": "http.response.body", "body": body, "more_body": not output.end})
        return 200


async def _next(queue: asyncio.Queue[News], gone: asyncio.Future[None]) -> News:
    getter = asyncio.ensure_future(queue.get())
    await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
    if not getter.done():
        getter.cancel()
        raise ClientGone
    return getter.result()
