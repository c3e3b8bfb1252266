"""The ASGI frontend in this process: the app `handler.frontend.app.build_app` makes, driven through
httpx's ASGITransport (no socket, no uvicorn; LitServe's pattern), for the route checks of
tests/integration/asgi/ that need no real server (tests/e2e keeps the ones about the process,
sockets, HTTP framing and timing).

ASGITransport does not run the app's lifespan, which loads the model: `running_in_process` runs it
here and waits for `/ping` to answer 200. The app and its client live on an event loop of their own
thread, so plain (sync) tests and module-scoped fixtures share one loaded model; ASGITransport
hands back a streamed response whole, once the app has sent all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx

from handler.frontend.app import KeyCheck, Limits, build_app
from handler.frontend.auth import BearerKey
from handler.frontend.embedding import ServedEmbedder
from handler.frontend.model import ServedModel

T = TypeVar("T")
BASE_URL = "http://asgi.in-process"
KEY = "in-process-test-key-of-enough-length"
READY_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 60.0
REPO = Path(__file__).resolve().parents[2]
PROFILE_7B = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"


def sim_config(tokenizer_dir: Path, **handler: Any) -> dict[str, Any]:
    """A generation model on the sim backend (no weights, `tokenizer_dir`'s tokenizer), continuous,
    without sleeping: its answers come as fast as the host computes them."""
    return {
        "batchSize": 16,
        "jobQueueSize": 16,
        "maxBatchDelay": 1,
        "continuousBatching": True,
        "handler": {
            "model_checkpoint_dir": str(tokenizer_dir),
            "backend": "sim",
            "n_positions": 1024,
            "default_max_new_tokens": 16,
            "max_new_tokens": 256,
            "sim": {"profile": str(PROFILE_7B), "time_scale": 0.0},
            **handler,
        },
        "scheduler": {"mode": "continuous", "n_slots": 8},  # the profile's compiled batch
    }


@dataclass
class InProcessFrontend:
    """The surface the route tests use: requests (sent with the key unless told otherwise) and the app's model."""

    loop: asyncio.AbstractEventLoop
    client: httpx.AsyncClient
    model: ServedModel | ServedEmbedder
    model_name: str
    key: str | None
    app: Any = None  # the ASGI app itself, for tests that drive its receive/send by hand

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"} if self.key is not None else {}

    @property
    def predictions_path(self) -> str:
        return f"/predictions/{self.model_name}"

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = REQUEST_TIMEOUT_S) -> T:
        """`coroutine` run on the app's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def request(self, method: str, path: str, *, auth: bool = True, **kwargs: Any) -> httpx.Response:
        """One request; `auth=False` sends no key, `headers=` adds to (or overrides) the key's."""
        headers = {**(self.headers if auth else {}), **kwargs.pop("headers", {})}
        return self.run(self.client.request(method, path, headers=headers, **kwargs))

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.request("POST", path, **kwargs)


@contextlib.contextmanager
def running_in_process(
    model: ServedModel | ServedEmbedder,
    model_name: str = "llama",
    key: str | None = KEY,
    sagemaker: bool = False,
    limits: Limits | None = None,
) -> Iterator[InProcessFrontend]:
    """The app over `model`, its lifespan started and `/ping` 200; stopped (the model released) on leaving."""
    app = build_app(model, model_name, BearerKey(value=key) if key is not None else None, sagemaker, limits or Limits())
    starlette_app = app.app if isinstance(app, KeyCheck) else app
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="asgi-in-process", daemon=True)
    thread.start()
    up, stop = threading.Event(), threading.Event()

    async def lifespan() -> None:
        """The app's lifespan (model loading at start, release at the end), held until `stop`."""
        async with starlette_app.router.lifespan_context(starlette_app):
            up.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    held = asyncio.run_coroutine_threadsafe(lifespan(), loop)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL)
    frontend = InProcessFrontend(loop, client, model, model_name, key, app)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not up.wait(0.02):
            if held.done():
                held.result()  # the startup's error
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process ASGI frontend's lifespan did not start")
        wait_ready(frontend)
        yield frontend
    finally:
        stop.set()
        try:
            frontend.run(client.aclose())
            held.result(READY_TIMEOUT_S)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(10)
            loop.close()


def wait_ready(frontend: InProcessFrontend, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while True:
        ping = frontend.get("/ping")
        if ping.status_code == 200:
            return
        if ping.json().get("status") == "Unhealthy" or time.monotonic() > deadline:
            raise RuntimeError(f"the in-process ASGI frontend did not become ready: {ping.status_code} {ping.text}")
        time.sleep(0.05)
