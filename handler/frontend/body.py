"""Reading a request body within the frontend's limits: its size (413 before anything is
read when Content-Length says so, else as soon as the bytes pass the limit) and its time
(408 for a client that sends too slowly)."""

from __future__ import annotations

import asyncio

from starlette.requests import Request

from handler.frontend.http_errors import PayloadTooLarge, RequestTimeout


async def read_body(request: Request, limit: int, timeout_s: float) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the body is {declared} bytes; this server accepts at most {limit}", "body")
    try:
        return await asyncio.wait_for(_read(request, limit), timeout_s)
    except asyncio.TimeoutError:
        raise RequestTimeout(f"the body did not arrive within {timeout_s:g} s", "body") from None


async def _read(request: Request, limit: int) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLarge(f"the body is over {limit} bytes, the most this server accepts", "body")
        chunks.append(chunk)
    return b"".join(chunks)
