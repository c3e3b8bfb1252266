"""Reading a request body within the frontend's limits: its size (413 before anything is
read when Content-Length says so, else as soon as the bytes pass the limit) and its time
(408 for a client that sends too slowly); and, once it is read, noticing the client leave."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive

from handler.frontend.http_errors import PayloadTooLarge, RequestTimeout

T = TypeVar("T")


class ClientLeft(Exception):
    """The client disconnected before its whole body arrived: nobody is left to answer (the app
    logs one line, never a traceback: a client could otherwise fill the log)."""


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; this server accepts at most {limit}", "body")
    try:
        return await asyncio.wait_for(_read(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {timeout_s:g} s", "body") from None
    except ClientDisconnect:
        raise ClientLeft from None


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body is over {limit} bytes, the most this server accepts", "body")
        chunks.append(chunk)
    return b"".join(chunks)


async def disconnected(receive: Receive) -> None:
    """Returns when the client disconnects (the body was read already: nothing else comes)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(receive: Receive, answer: Awaitable[T]) -> T | None:
    """`answer`'s result, or None (and `answer` cancelled) if the client disconnects first."""
    task, gone = asyncio.ensure_future(answer), asyncio.ensure_future(disconnected(receive))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        finished = task.done()
        if not finished:  # the client left, or we were cancelled ourselves
            task.cancel()
    return task.result() if finished else None
