"""What the fault tests (shutdown, worker crash) share: a torchserve on the sim backend,
slow enough that streams last seconds, and how a response ended as its client saw it.

A streamed response ends in one of these ways:
- `finish`: its last NDJSON line (or SSE event before `[DONE]`) carries a finish_reason;
- `error`: its last line (event) is an `{"error": ...}`: the server said why it stopped;
- `broken`: the connection closed before the chunked body's terminating chunk; httpx
  raises, so the client knows the response is incomplete;
- `error_status`: no stream was opened; a 4xx/5xx with its body;
- `silent`: a complete response with neither a finish_reason nor an error: the client
  cannot tell the completion was cut. The servers must never end a response this way.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.support.modes import with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parent.parent.parent
# Llama-2-7B on inf2.48xlarge, as timed by its profile: a decode step is 6.5-12 ms, so a
# stream of a few thousand tokens lasts many seconds.
SIM_CONFIG: dict[str, Any] = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "sim",
        "n_positions": 4096,
        "max_new_tokens": 4000,
        "sim": {"profile": str(REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"), "time_scale": 1.0},
    },
    "micro_batching": {"micro_batch_size": 8},
}
N_SLOTS = 8  # the profile's compiled batch size


def start_sim_server(workdir: Path, model_dir: Path, mode: str, **overrides: Any) -> TorchServe:
    """The sim server in `mode` (with its state dir, so it can drain); `overrides` go into the model config."""
    config = {**with_mode(SIM_CONFIG, mode, n_slots=N_SLOTS), **overrides}
    server = start_torchserve(workdir, model_dir, config)
    assert server.state_dir is not None
    server.mode = mode
    return server


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting for its parent."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def openai_url(server: TorchServe) -> str:
    return f"{server.predictions_url}/1.0/v1/completions"


@dataclass
class Outcome:
    status: int = 0
    content_type: str = ""
    sent_at: float = 0.0  # time.perf_counter() when the request was sent
    first_at: float | None = None  # when the first body bytes arrived
    ended_at: float = 0.0  # when the response ended, complete or not
    body: bytes = b""
    broken: str | None = None  # the client's error when the connection failed mid-response
    first: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def events(self) -> list[dict[str, Any]]:
        """The NDJSON lines, or the SSE `data:` objects (without `[DONE]`)."""
        text = self.body.decode("utf-8", errors="replace")
        if self.content_type.startswith("text/event-stream"):
            data = [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]
            return [json.loads(d) for d in data if d != "[DONE]" and _whole_json(d)]
        return [json.loads(line) for line in text.splitlines() if line.strip() and _whole_json(line)]

    @property
    def sse_done(self) -> bool:
        return self.body.rstrip().endswith(b"data: [DONE]")

    @property
    def ending(self) -> str:
        if self.broken is not None:
            return "broken"
        if self.status >= 400:
            return "error_status"
        events = self.events
        last = events[-1] if events else {}
        if "error" in last:
            return "error"
        choices = last.get("choices") or [{}]
        if last.get("finish_reason") or choices[0].get("finish_reason"):
            return "finish"
        if self.content_type.startswith("text/event-stream") and len(events) > 1 and "usage" in last:
            previous = (events[-2].get("choices") or [{}])[0]  # the usage chunk follows the finish chunk
            if previous.get("finish_reason"):
                return "finish"
        return "silent"

    @property
    def error(self) -> dict[str, Any] | None:
        if self.ending == "error":
            return self.events[-1]["error"]
        if self.ending == "error_status":
            try:
                return json.loads(self.body)
            except ValueError:
                return {"raw": self.body.decode("utf-8", errors="replace")}
        return None


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False  # a line cut by a broken connection
    return True


def request(
    url: str, body: dict[str, Any], headers: dict[str, str], out: Outcome | None = None, timeout: float = 120
) -> Outcome:
    """POST and read the response as it arrives, into `out`; never raises for a broken response."""
    out = out or Outcome()
    out.sent_at = time.perf_counter()
    try:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
            out.status = response.status_code
            out.content_type = response.headers.get("content-type", "")
            for piece in response.iter_raw():
                if out.first_at is None:
                    out.first_at = time.perf_counter()
                    out.first.set()
                out.body += piece
    except httpx.TransportError as exc:  # RemoteProtocolError: incomplete chunked read, or no response at all
        out.broken = f"{type(exc).__name__}: {exc}"
    finally:
        out.ended_at = time.perf_counter()
        out.first.set()
    return out


class InBackground:
    """A request on a thread of its own; its `outcome` is whole once `join()` returned."""

    def __init__(self, url: str, body: dict[str, Any], headers: dict[str, str]) -> None:
        self.outcome = Outcome()
        self._thread = threading.Thread(target=request, args=(url, body, headers, self.outcome), daemon=True)
        self._thread.start()

    def wait_first(self, timeout: float) -> bool:
        """Until the first body bytes arrived (or the response ended)."""
        return self.outcome.first.wait(timeout)

    def join(self, timeout: float = 120) -> Outcome:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the request did not end"
        return self.outcome
