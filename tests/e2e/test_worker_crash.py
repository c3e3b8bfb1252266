"""`kill -9` of the Python worker during streams, through a real torchserve (continuous
engine, sim backend).

What TorchServe's frontend does (WorkerThread.run's finally, 0.11 and 0.12): every request
of the step in flight gets `sendError("Worker died.")`. A request whose stream is open
(status 200 and chunks on the wire) cannot take a new status: Netty refuses to encode a
second response on it and the connection is closed, so the client gets a broken chunked
stream (no terminating chunk: httpx raises). One with nothing sent yet gets a plain JSON
error, status 507 (TorchServe reads the exit status 137 of a SIGKILL as out of memory).
Requests still in the frontend's queue (beyond batchSize) wait for the restarted worker.

So: every in-flight request ends within 5 s with an error its client sees, never a clean end
without a finish_reason; the queued ones are served by the restarted worker; /ping and the
next request recover; no worker process is left once the harness stops the server.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.bench.soak import gauges
from tests.e2e.faults import N_SLOTS, InBackground, Outcome, alive, openai_url, start_sim_server
from tests.support.torchserve_process import TorchServe

LONG = 3000  # tokens: about 30 s at the sim's pace
ENDED_WITHIN_S = 5.0  # the bound for every in-flight request


@pytest.fixture
def sim_server(tiny_model_dir: Path, tmp_path: Path) -> Iterator[TorchServe]:
    # batchSize = the slots: requests beyond them wait in the frontend's queue, not in the worker.
    server = start_sim_server(tmp_path / "ts", tiny_model_dir, "continuous", batchSize=N_SLOTS)
    try:
        yield server
    finally:
        workers = server.worker_pids()
        server.stop()
        assert not [pid for pid in workers if alive(pid)], "a worker process outlived the harness's stop"


@pytest.mark.timeout(300)
def test_kill_9_of_the_worker_mid_stream(sim_server: TorchServe):
    server = sim_server
    native, headers, body = server.predictions_url, server.headers, {"ignore_eos": True}
    streams = {
        f"native {i}": InBackground(native, {**body, "prompt": f"stream {i}", "max_new_tokens": LONG}, headers)
        for i in range(3)
    }
    for i in range(2):
        streams[f"openai {i}"] = InBackground(
            openai_url(server),
            {**body, "model": "llama", "prompt": f"sse {i}", "max_tokens": LONG, "stream": True},
            headers,
        )
    for name, stream in streams.items():
        assert stream.wait_first(60), f"{name}: no first chunk"
    # Fill the worker's batch with requests that have sent nothing yet, then queue two more.
    waiting = {
        f"whole {i}": InBackground(
            native, {**body, "prompt": f"whole {i}", "max_new_tokens": LONG, "stream": False}, headers
        )
        for i in range(N_SLOTS - len(streams))
    }
    # The frontend hands them over at its next step; TorchServe 0.11 was seen to keep one of them
    # in its queue while the batch is this full. Those the worker holds must die with it, the rest
    # must be served by the restarted worker.
    held = _wait_until_the_worker_holds(server, N_SLOTS)
    assert held > len(streams), f"the worker holds {held} requests: none of the non-streamed ones"
    queued = {
        f"queued {i}": InBackground(native, {**body, "prompt": f"queued {i}", "max_new_tokens": 20}, headers)
        for i in range(2)
    }
    time.sleep(1.0)
    for name, stream in streams.items():
        assert stream.outcome.ended_at == 0.0, f"{name} ended before the kill"
    (worker,) = server.worker_pids()

    killed_at = time.perf_counter()
    os.kill(worker, signal.SIGKILL)
    served_again = _first_200(server, killed_at)  # first: the joins below may wait for a long request
    ping_again = _ping_200(server, killed_at)
    in_flight = {name: r.join() for name, r in {**streams, **waiting}.items()}
    served_queued = {name: r.join() for name, r in queued.items()}

    _print_timeline(killed_at, in_flight, served_queued, served_again, ping_again)
    died = {name: o for name, o in in_flight.items() if o.ending in ("error", "broken", "error_status")}
    for name, outcome in died.items():
        assert outcome.ended_at - killed_at <= ENDED_WITHIN_S, (
            f"{name} ended {outcome.ended_at - killed_at:.1f} s later"
        )
    for name in streams:
        assert name in died, f"{name} ended {in_flight[name].ending}: {in_flight[name]}"
        assert in_flight[name].status == 200 and in_flight[name].body, f"{name} had no stream open"
    assert len(died) == held, f"{len(died)} requests died with the worker, which held {held}"
    for name in waiting:
        if name in died:  # its response opened before its prefill (docs/operations.md#a-client-that-leaves):
            outcome = in_flight[name]  # the cut body of a 200, or a 5xx where none had opened yet
            assert outcome.status >= 500 or (outcome.status == 200 and outcome.broken and not outcome.body), (
                f"{name}: {outcome}"
            )
        else:  # still in the frontend's queue at the kill: served in full by the restarted worker
            assert (in_flight[name].status, in_flight[name].ending) == (200, "finish"), f"{name}: {in_flight[name]}"
    for name, outcome in served_queued.items():
        assert (outcome.status, outcome.ending) == (200, "finish"), f"{name} was not served: {outcome}"
    assert server.worker_pids() and worker not in server.worker_pids()
    assert not alive(worker)


def _wait_until_the_worker_holds(server: TorchServe, requests: int, timeout_s: float = 60.0) -> int:
    """How many requests the handler's gauges (Prometheus) count in the worker, decoding or
    waiting for a slot, once they reach `requests` or have not grown for 3 s."""
    deadline = time.monotonic() + timeout_s
    held, since, repeated = 0, time.monotonic(), False
    while time.monotonic() < deadline:
        # Two scrapes in a row must agree: the frontend updates the two gauges one log line at a
        # time, so one scrape can add this call's occupied slots to the last call's waiting count.
        now = int(sum(gauges(server.scrape_metrics()).values()))
        repeated = now == held
        if not repeated:
            held, since = now, time.monotonic()
        if (held >= requests and repeated) or (held and time.monotonic() - since > 3.0):
            return held
        time.sleep(0.1)
    raise AssertionError(f"the worker's count of requests was still changing ({held}) after {timeout_s} s")


def _first_200(server: TorchServe, since: float) -> float:
    """Seconds from `since` until a new request is answered 200."""
    body = {"prompt": "are you back?", "max_new_tokens": 4, "stream": False}
    for _ in range(600):
        try:
            if httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60).status_code == 200:
                return time.perf_counter() - since
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise AssertionError("no request was served after the crash")


def _ping_200(server: TorchServe, since: float) -> float:
    for _ in range(600):
        if httpx.get(f"{server.url}/ping", headers=server.headers, timeout=10).status_code == 200:
            return time.perf_counter() - since
        time.sleep(0.1)
    raise AssertionError("/ping never said 200 again")


def _print_timeline(
    killed_at: float, in_flight: dict[str, Outcome], queued: dict[str, Outcome], served: float, ping: float
) -> None:
    print("\n[kill -9 of the worker]")
    for name, outcome in {**in_flight, **queued}.items():
        detail = outcome.broken or f"status {outcome.status}"
        print(f"  {name}: {outcome.ending} ({detail}) {outcome.ended_at - killed_at:.2f} s after the kill")
    print(f"  next request served {served:.2f} s after the kill; /ping 200 after {ping:.2f} s")


@pytest.mark.timeout(300)
def test_a_killed_frontend_leaves_no_worker_behind(sim_server: TorchServe):
    """TorchServe's workers can outlive a frontend killed with SIGKILL; the harness's stop (the
    code `make stop` runs) finds them by their socket in the server's temp dir and kills them
    (the fixture checks that none is left)."""
    server = sim_server
    stream = InBackground(
        server.predictions_url, {"prompt": "orphan", "max_new_tokens": LONG, "ignore_eos": True}, server.headers
    )
    assert stream.wait_first(60)
    workers, frontend = server.worker_pids(), server.frontend_pid()
    assert workers and frontend
    os.kill(frontend, signal.SIGKILL)
    outcome = stream.join()
    assert outcome.ending == "broken", outcome
    left = [pid for pid in workers if alive(pid)]
    report = server.stop()
    print(f"\n[kill -9 of the frontend] workers alive after it: {left}; the stop killed {report.workers_killed}")
    assert not [pid for pid in workers if alive(pid)]
