"""One generation request as an ASGI response: submitted to the engine at once, answered with
the route's own wire format (handler/api/) as the engine's updates come.

The status line waits for the first update, so a request that fails before any text gets its
own 4xx/5xx; after that, chunks go out as each step makes them, and a failure is the route's
mid-stream error. A client that disconnects (before or during the stream) aborts the request's
sequences: the engine frees their slots at its next step.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from handler.core.preparation import GenerationCore, Work
from handler.core.replies import STREAM_HEADERS, STREAMED_TYPES, wire_error
from handler.engine.outbox import Update
from handler.errors import ServingError, to_http
from handler.frontend.body import disconnected
from handler.frontend.bridge import EngineBridge
from handler.frontend.metrics import FrontendMetrics

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
# How often a request with a grammar constraint looks whether it compiled (handler/grammar/compiler.py).
COMPILE_POLL_S = 0.02


class ClientGone(Exception):
    """The client closed the connection."""


def response_headers(content_type: str, request_id: str, length: int | None = None) -> list[tuple[bytes, bytes]]:
    headers = [(b"content-type", content_type.encode()), (b"x-request-id", request_id.encode())]
    if content_type in STREAMED_TYPES:
        headers += [(k.lower().encode(), v.encode()) for k, v in STREAM_HEADERS.items()]
    if length is not None:
        headers.append((b"content-length", str(length).encode()))
    return headers


async def send_whole(send: Send, status: int, content_type: str, request_id: str, body: str) -> None:
    data = body.encode("utf-8", errors="replace")
    headers = response_headers(content_type, request_id, len(data))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, work: Work, error: ServingError) -> int:
    status, _ = work.api.http_status(error)
    await send_whole(send, status, "application/json", work.request_id, work.api.error(error, midstream=False))
    return status


class GenerationResponse:
    """The ASGI response of one prepared request (`work`, its error or reply already decided)."""

    def __init__(
        self, core: GenerationCore, bridge: EngineBridge, metrics: FrontendMetrics, work: Work, route: str
    ) -> None:
        self.core = core
        self.bridge = bridge
        self.metrics = metrics
        self.work = work
        self.route = route
        self._queue: asyncio.Queue[Update] | None = None
        self._open: set[str] = set()  # sequence ids not ended yet

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 0
        gone = asyncio.ensure_future(disconnected(receive))
        try:
            status = await self._respond(send, gone)
        except ClientGone:
            status = 499  # nginx's name for it: the client closed the request
        finally:
            gone.cancel()
            if self._open:
                self.bridge.abort(s for s in self.work.sequences if s.request_id in self._open)
                self.metrics.cancelled()
            self.metrics.response(self.route, status)

    async def _respond(self, send: Send, gone: asyncio.Future[None]) -> int:
        work = self.work
        if work.error is None and work.reply is None:
            await self._settle(gone)
        if work.error is not None:
            logger.info("request %s failed: %s %s", work.request_id, work.error.status, work.error.message)
            return await send_error(send, work, work.error)
        if work.reply is not None:
            await send_whole(send, 200, "application/json", work.request_id, work.reply)
            return 200
        self._open = {s.request_id for s in work.sequences}
        self._queue = self.bridge.submit(work.sequences)
        if len(work.sequences) > 1:
            return await self._choices(send, gone)
        return await self._single(send, gone)

    async def _settle(self, gone: asyncio.Future[None]) -> None:
        """Wait (off the step thread, without blocking the loop) for a grammar constraint to compile."""
        while not self.core.settle(self.work):
            if gone.done():
                raise ClientGone
            await asyncio.sleep(COMPILE_POLL_S)

    async def _next(self, gone: asyncio.Future[None]) -> Update:
        assert self._queue is not None
        getter = asyncio.ensure_future(self._queue.get())
        await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not getter.done():
            getter.cancel()
            raise ClientGone
        update = getter.result()
        if update.ended:
            self._open.discard(update.sequence.request_id)
        return update

    async def _single(self, send: Send, gone: asyncio.Future[None]) -> int:
        work, api = self.work, self.work.api
        sequence = work.sequences[0]
        content_type = api.content_type(sequence.request)
        if not sequence.request.stream:
            update = await self._next(gone)
            while not update.ended:
                update = await self._next(gone)
            if sequence.error is not None:
                return await self._fail(send, wire_error(api, sequence.error))
            self._finished(sequence)
            await send_whole(send, 200, content_type, work.request_id, api.final(sequence))
            return 200
        started = False
        while True:
            update = await self._next(gone)
            body = api.chunk(sequence, update.text) if update.text else ""
            if sequence.error is not None:
                error = wire_error(api, sequence.error)
                if not started and not body:
                    return await self._fail(send, error)
                logger.info("request %s failed mid-stream: %s", work.request_id, error.message)
                body += api.error(error, midstream=True)
            elif update.ended:
                self._finished(sequence)
                body += api.final(sequence)
            if body or update.ended:
                if not started:
                    await self._start(send, content_type)
                    started = True
                await self._chunk(send, body, more=not update.ended)
            if update.ended:
                return 200

    async def _choices(self, send: Send, gone: asyncio.Future[None]) -> int:
        """Several outputs (OpenAI `n`): each choice's chunks and its own last chunk as it ends; the
        response ends when every choice has. One choice failing fails the request."""
        work, api = self.work, self.work.api
        stream = work.sequence.request.stream
        content_type = api.content_type(work.sequence.request)
        started = False
        while True:
            update = await self._next(gone)
            sequence = update.sequence
            body = ""
            if stream and update.text:
                body += api.chunk(sequence, update.text)
            if sequence.error is not None:
                self.bridge.abort(s for s in work.sequences if s.request_id in self._open)
                self._open.clear()
                error = wire_error(api, sequence.error)
                if not (stream and (started or body)):
                    return await self._fail(send, error)
                body += api.error(error, midstream=True)
                if not started:
                    await self._start(send, content_type)
                await self._chunk(send, body, more=False)
                return 200
            if update.ended and stream:
                body += api.finish(sequence)
            done = not self._open
            if done:
                for each in work.sequences:
                    self._finished(each)
                body += api.close(work.sequences)
            if not stream:
                if done:
                    await send_whole(send, 200, content_type, work.request_id, body)
                    return 200
                continue
            if body:
                if not started:
                    await self._start(send, content_type)
                    started = True
                await self._chunk(send, body, more=not done)
            if done:
                return 200

    async def _start(self, send: Send, content_type: str) -> None:
        headers = response_headers(content_type, self.work.request_id)
        await send({"type": "http.response.start", "status": 200, "headers": headers})

    @staticmethod
    async def _chunk(send: Send, body: str, more: bool) -> None:
        await send({"type": "http.response.body", "body": body.encode("utf-8", errors="replace"), "more_body": more})

    async def _fail(self, send: Send, error: ServingError) -> int:
        logger.info("request %s failed: %s %s", self.work.request_id, error.status, error.message)
        return await send_error(send, self.work, error)

    def _finished(self, sequence: Any) -> None:
        self.core.log_request(self.work, sequence)
        self.metrics.request_finished(sequence)


__all__ = ["ClientGone", "GenerationResponse", "send_error", "send_whole", "to_http"]
