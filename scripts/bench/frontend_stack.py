"""Which ASGI stack serves the frontend (docs/frontends.md, "Why uvicorn + Starlette"): the same
tiny streaming app on uvicorn + Starlette, uvicorn + FastAPI and hypercorn + Starlette, each in its
own process, measured from a client process on this machine:

  per-chunk   a stream of CHUNKS small chunks sent as fast as the stack takes them: µs per chunk
  disconnect  a stream of a chunk every 5 ms; the client closes after 5 chunks: ms until the
              server's generator is cancelled (both processes read CLOCK_MONOTONIC)
  keep-alive  REQUESTS sequential small POSTs on one client: requests/s, and how many TCP
              connections the server saw (1 = every request reused the first)

    .venv/bin/python -m scripts.bench.frontend_stack [--rounds 3]

A benchmark, not a test: it prints figures (medians over rounds) and decides nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from typing import Any, ClassVar

import httpx

from scripts.serve.local_torchserve import free_port

try:  # at module level: FastAPI resolves the (string) annotations of its endpoints in the module's globals
    from fastapi import Request as FastAPIRequest
except ImportError:  # only the other stacks can be measured
    FastAPIRequest = Any

STACKS = ("uvicorn+starlette", "uvicorn+fastapi", "hypercorn+starlette")
CHUNKS = 2000
REQUESTS = 300
TICK_S = 0.005


# -- the server side -------------------------------------------------------------------
class Probe:
    """What the server records for the client to read back (/probe)."""

    cancelled_at: float | None = None
    clients: ClassVar[set[str]] = set()


async def fast_chunks() -> Any:
    for _ in range(CHUNKS):
        yield b'{"text": "tok"}\n'


async def slow_chunks() -> Any:
    Probe.cancelled_at = None
    try:
        while True:
            yield b'{"text": "tok"}\n'
            await asyncio.sleep(TICK_S)
    finally:  # cancelled (or closed) when the stack sees the client gone
        Probe.cancelled_at = time.monotonic()


def starlette_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def fast(request: Request) -> StreamingResponse:
        return StreamingResponse(fast_chunks(), media_type="application/x-ndjson")

    async def slow(request: Request) -> StreamingResponse:
        return StreamingResponse(slow_chunks(), media_type="application/x-ndjson")

    async def small(request: Request) -> JSONResponse:
        client = request.scope.get("client")
        Probe.clients.add(f"{client[0]}:{client[1]}" if client else "?")
        return JSONResponse({"echo": len(await request.body())})

    async def probe(request: Request) -> JSONResponse:
        return JSONResponse({"cancelled_at": Probe.cancelled_at, "clients": len(Probe.clients)})

    routes = [
        Route("/fast", fast, methods=["POST"]),
        Route("/slow", slow, methods=["POST"]),
        Route("/small", small, methods=["POST"]),
        Route("/probe", probe),
    ]
    return Starlette(routes=routes)


def fastapi_app() -> Any:
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    app = FastAPI()

    @app.post("/fast")
    async def fast() -> StreamingResponse:
        return StreamingResponse(fast_chunks(), media_type="application/x-ndjson")

    @app.post("/slow")
    async def slow() -> StreamingResponse:
        return StreamingResponse(slow_chunks(), media_type="application/x-ndjson")

    @app.post("/small")
    async def small(request: FastAPIRequest) -> dict[str, int]:
        client = request.client
        Probe.clients.add(f"{client.host}:{client.port}" if client else "?")
        return {"echo": len(await request.body())}

    @app.get("/probe")
    async def probe() -> dict[str, Any]:
        return {"cancelled_at": Probe.cancelled_at, "clients": len(Probe.clients)}

    return app


def serve(stack: str, port: int) -> None:
    server, framework = stack.split("+")
    app = fastapi_app() if framework == "fastapi" else starlette_app()
    if server == "uvicorn":
        import uvicorn

        uvicorn.run(app, host="127.0.0.1", port=port, http="h11", log_level="warning", server_header=False)
        return
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.loglevel = "WARNING"
    asyncio.run(hypercorn_serve(app, config))


# -- the client side -------------------------------------------------------------------
def measure(url: str) -> dict[str, float]:
    with httpx.Client(base_url=url, timeout=30) as client:
        started = time.perf_counter()
        with client.stream("POST", "/fast") as response:
            received = sum(1 for _ in response.iter_raw())
        per_chunk_us = (time.perf_counter() - started) / CHUNKS * 1e6
        with client.stream("POST", "/slow") as response:
            reads = response.iter_raw()
            for _ in range(5):
                next(reads)
            closed_at = time.monotonic()
        deadline = time.monotonic() + 5
        cancelled = None
        while cancelled is None and time.monotonic() < deadline:
            cancelled = client.get("/probe").json()["cancelled_at"]
            time.sleep(0.001)
        disconnect_ms = (cancelled - closed_at) * 1000 if cancelled is not None else float("inf")
        before = client.get("/probe").json()["clients"]
        started = time.perf_counter()
        for _ in range(REQUESTS):
            client.post("/small", json={"prompt": "x" * 100}).raise_for_status()
        per_s = REQUESTS / (time.perf_counter() - started)
        connections = client.get("/probe").json()["clients"] - before
    return {
        "per_chunk_us": per_chunk_us,
        "reads": received,
        "disconnect_ms": disconnect_ms,
        "keepalive_req_per_s": per_s,
        "connections": connections,
    }


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/probe", timeout=2)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not start")


def bench(stack: str, rounds: int) -> dict[str, float]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scripts.bench.frontend_stack", "--serve", stack, "--port", str(port)]
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_up(url)
        results = [measure(url) for _ in range(rounds)]
    finally:
        process.terminate()
        process.wait(10)
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", choices=STACKS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stacks", nargs="*", default=list(STACKS), choices=STACKS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port)
        return
    table = {stack: bench(stack, args.rounds) for stack in args.stacks}
    print(f"{'stack':22} {'µs/chunk':>9} {'reads':>6} {'disconnect ms':>14} {'keep-alive req/s':>17} {'conns':>6}")
    for stack, r in table.items():
        print(
            f"{stack:22} {r['per_chunk_us']:9.1f} {r['reads']:6.0f} {r['disconnect_ms']:14.1f} "
            f"{r['keepalive_req_per_s']:17.0f} {r['connections']:6.0f}"
        )
    print(json.dumps(table))


if __name__ == "__main__":
    main()
