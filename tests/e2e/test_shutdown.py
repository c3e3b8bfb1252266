"""Graceful shutdown through a real torchserve: the stop that `make stop` runs
(scripts/serve/stop_server.py, here through the harness's TorchServe.stop) drains the server.

Streams in flight when the stop begins either finish (with a finish_reason) within the
grace period or end with an in-band error line at its deadline, never cut without one; a
request sent during the drain gets a 503 JSON error; the stop returns once the workers are
drained, and leaves no worker process behind. Both scheduling modes, on the sim backend.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.serving import drain
from handler.serving.state import DRAIN_FILE
from scripts.serve.stop_server import DRAIN_MARGIN_S, StopReport
from tests.e2e.faults import InBackground, Outcome, alive, openai_url, request, start_sim_server
from tests.support.modes import MODES
from tests.support.torchserve_process import TorchServe

GRACE_S = 3.0
LONG = 3000  # tokens: about 30 s at the sim's pace, far beyond the grace period
SHORT = 100  # tokens: about a second, well within it


@pytest.fixture(params=MODES)
def sim_server(request, tiny_model_dir: Path, tmp_path: Path) -> Iterator[TorchServe]:
    # Static: the streams go out as one frontend batch (they arrive within maxBatchDelay).
    overrides = {"batchSize": 8, "maxBatchDelay": 500} if request.param == "static" else {}
    server = start_sim_server(tmp_path / "ts", tiny_model_dir, request.param, **overrides)
    try:
        yield server
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_stop_drains_the_streams_in_flight(sim_server: TorchServe):
    server = sim_server
    native = server.predictions_url
    streams = _start_streams(server)
    for name, stream in streams.items():
        assert stream.wait_first(60), f"{name}: no first chunk"
    workers = server.worker_pids()
    assert workers, "no worker process found"

    stopped: dict[str, object] = {}
    stopper = threading.Thread(target=_stop, args=(server, stopped), daemon=True)
    stopper.start()
    _wait_for(lambda: (server.state_dir / DRAIN_FILE).exists(), 10)
    time.sleep(0.5)  # the workers poll the drain order every 0.1 s
    late = request(native, {"prompt": "too late", "max_new_tokens": 5}, server.headers)

    outcomes = {name: stream.join() for name, stream in streams.items()}
    stopper.join(120)
    assert not stopper.is_alive(), "the stop did not return"
    report: StopReport = stopped["report"]  # type: ignore[assignment]
    began: float = stopped["began"]  # type: ignore[assignment]

    _print_timeline(server.mode, began, stopped, outcomes, late, report)
    for name, outcome in outcomes.items():
        assert outcome.status == 200 and outcome.broken is None, f"{name}: {outcome}"
        assert outcome.ending in ("finish", "error"), f"{name} ended {outcome.ending}: {outcome.body[-300:]!r}"
    assert outcomes["short"].ending == "finish", "a stream that fits in the grace period was cut"
    for name in ("long 1", "long 2", "openai"):
        assert outcomes[name].ending == "error", f"{name} should have been cut at the deadline"
        assert outcomes[name].error["message"] == drain.CUT
    assert outcomes["openai"].sse_done, "the SSE stream should end with [DONE] after its error event"
    # Continuous: answered at once. Static: TorchServe hands the worker one batch at a time, so
    # the 503 comes when the running batch ends (at the latest at the deadline).
    assert late.ending == "error_status" and late.status == 503, f"late request: {late}"
    assert late.error["error"]["type"] == "service_unavailable"

    assert report.undrained == [], f"workers not drained by the deadline + {DRAIN_MARGIN_S} s: {report}"
    assert report.drain_s is not None and report.drain_s <= GRACE_S + DRAIN_MARGIN_S
    assert server.frontend_pid() is None
    assert not [pid for pid in workers if alive(pid)], "a worker process outlived the stop"
    assert not (server.state_dir / DRAIN_FILE).exists()


def _start_streams(server: TorchServe) -> dict[str, InBackground]:
    native, headers = server.predictions_url, server.headers
    body = {"ignore_eos": True}
    return {
        "short": InBackground(native, {**body, "prompt": "a short one", "max_new_tokens": SHORT}, headers),
        "long 1": InBackground(native, {**body, "prompt": "a long one", "max_new_tokens": LONG}, headers),
        "long 2": InBackground(native, {**body, "prompt": "another", "max_new_tokens": LONG}, headers),
        "openai": InBackground(
            openai_url(server),
            {**body, "model": "llama", "prompt": "an SSE one", "max_tokens": LONG, "stream": True},
            headers,
        ),
    }


def _stop(server: TorchServe, out: dict[str, object]) -> None:
    out["began"] = time.perf_counter()
    out["report"] = server.stop(drain_grace_s=GRACE_S)
    out["returned"] = time.perf_counter()


def _wait_for(condition, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _print_timeline(
    mode: str, began: float, stopped: dict, outcomes: dict[str, Outcome], late: Outcome, report: StopReport
) -> None:
    print(
        f"\n[{mode}] stop with {GRACE_S:.0f} s grace: {report.summary()}; returned after "
        f"{stopped['returned'] - began:.2f} s"
    )
    for name, outcome in outcomes.items():
        print(f"  {name}: {outcome.ending} {outcome.ended_at - began:.2f} s after the stop began")
    print(f"  request during the drain: {late.status} after {late.ended_at - late.sent_at:.3f} s")
