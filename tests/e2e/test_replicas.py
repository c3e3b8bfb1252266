"""`scheduler.replicas` through a real torchserve: R model copies in child processes of the one
continuous worker (and of the ASGI frontend's process).

- sim, R = 3, behind either frontend: concurrent streams spread evenly over the replicas; a kill
  -9 of one replica mid-stream ends its own streams with an in-band error within 5 s while the
  other replicas' streams finish with a finish_reason; /ping stays 200 ("Degraded" while it
  restarts); the replica comes back (a new process, after its warm-up) and is dispatched to
  again; every slot is free at the end, and no replica outlives the server.
- hf (the tiny model), R = 2: greedy requests give the same text whichever replica serves
  them and whatever their batch-mates; logprobs work through a replica.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest

from scripts.bench.soak import gauges
from tests.e2e.faults import SIM_CONFIG, InBackground, Outcome, alive, openai_url
from tests.support.asgi_frontend import ASGI, AsgiFrontend, start_asgi_frontend
from tests.support.modes import with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

N_SLOTS = 8  # the sim profile's compiled batch size
Served = TorchServe | AsgiFrontend
ENDED_WITHIN_S = 5.0
SERVING = re.compile(r"replica (\d+) \(pid (\d+)\) is serving")
DISPATCHED = re.compile(r"request (\S+) to replica (\d+)")


def replica_pids(server: Served) -> dict[int, int]:
    """The latest pid of each replica that said it serves, from the worker's log."""
    return {int(index): int(pid) for index, pid in SERVING.findall(server.log_text())}


def dispatched(server: Served) -> Counter[int]:
    return Counter(int(index) for _, index in DISPATCHED.findall(server.log_text()))


def replica_processes(server: Served) -> list[int]:
    found = []
    for worker in server.worker_pids():
        try:
            found += [c.pid for c in psutil.Process(worker).children() if "handler.replicas.child" in c.cmdline()]
        except psutil.NoSuchProcess:
            pass
    return found


def stop_and_check(server: Served) -> None:
    workers, children = server.worker_pids(), replica_processes(server)
    server.stop()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and [p for p in workers + children if alive(p)]:
        time.sleep(0.1)
    assert not [p for p in workers + children if alive(p)], "a worker or replica process outlived the server"


@pytest.fixture(params=("torchserve", ASGI))
def sim_replicas(request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path: Path) -> Iterator[Served]:
    """Three sim replicas behind TorchServe's one worker, or in the ASGI frontend's own process."""
    config = with_mode(SIM_CONFIG, "continuous", n_slots=N_SLOTS)
    config["scheduler"] = {**config["scheduler"], "replicas": 3}
    config.update(batchSize=3 * N_SLOTS, jobQueueSize=4 * 3 * N_SLOTS)
    if request.param == ASGI:
        server: Served = start_asgi_frontend(tmp_path / "asgi", tiny_model_dir, config)
    else:
        server = start_torchserve(tmp_path / "ts", tiny_model_dir, config)
    try:
        yield server
    finally:
        stop_and_check(server)


@pytest.mark.both_frontends
@pytest.mark.timeout(300)
def test_kill_9_of_one_replica_mid_stream(sim_replicas: Served):
    server = sim_replicas
    before = replica_pids(server)
    assert sorted(before) == [0, 1, 2], f"replicas serving at start: {before}"
    assert len(replica_processes(server)) == 3
    body = {"ignore_eos": True, "max_new_tokens": 700}
    counted = dispatched(server)  # the harness's own requests at start
    streams: dict[str, InBackground] = {}
    for i in range(9):
        if i % 3:
            url, request = server.predictions_url, {**body, "prompt": f"native {i}"}
        else:
            url = openai_url(server)
            request = {"model": "llama", "prompt": f"sse {i}", "max_tokens": 700, "ignore_eos": True, "stream": True}
        streams[f"stream {i}"] = InBackground(url, request, server.headers)
    for name, stream in streams.items():
        assert stream.wait_first(60), f"{name}: no first chunk"
    spread = dispatched(server) - counted
    assert spread == Counter({0: 3, 1: 3, 2: 3}), f"9 streams did not spread 3 per replica: {spread}"
    victim = before[1]

    killed_at = time.perf_counter()
    psutil.Process(victim).kill()
    degraded = _ping_while_restarting(server)
    back = time.perf_counter() - killed_at  # /ping said Healthy again: every replica serves
    outcomes = {name: stream.join() for name, stream in streams.items()}
    new_pid = replica_pids(server)[1]
    assert new_pid != victim and alive(new_pid), "replica 1 is not a new process"

    _print_timeline(killed_at, outcomes, back, degraded)
    errored = {name: o for name, o in outcomes.items() if o.ending == "error"}
    finished = {name: o for name, o in outcomes.items() if o.ending == "finish"}
    assert len(errored) == 3 and len(finished) == 6, {n: o.ending for n, o in outcomes.items()}
    for name, outcome in errored.items():
        assert outcome.ended_at - killed_at <= ENDED_WITHIN_S, (
            f"{name} ended {outcome.ended_at - killed_at:.1f} s later"
        )
        assert "replica 1" in outcome.error["message"] and "SIGKILL" in outcome.error["message"], outcome.error
        if outcome.content_type.startswith("text/event-stream"):
            assert outcome.sse_done, f"{name}: no [DONE] after the error event"
    for name, outcome in finished.items():
        assert outcome.ended_at - killed_at > 1.0, f"{name} finished too soon to have overlapped the kill"
    assert degraded, "/ping never said Degraded while replica 1 was down"

    # Replica 1 is dispatched to again: three short requests at once go one per replica.
    again = [
        InBackground(
            server.predictions_url, {"prompt": f"again {i}", "max_new_tokens": 200, "ignore_eos": True}, server.headers
        )
        for i in range(3)
    ]
    counted = dispatched(server)
    assert all(r.join().ending == "finish" for r in again)
    assert dispatched(server) - counted == Counter({0: 1, 1: 1, 2: 1})
    assert not any(gauges(server.scrape_metrics()).values()), "a slot or a waiting request leaked"
    assert httpx.get(f"{server.url}/ping", headers=server.headers).json()["status"] == "Healthy"


def _ping_while_restarting(server: Served) -> list[dict]:
    """/ping answers while the killed replica restarts: each must be 200."""
    seen = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        response = httpx.get(f"{server.url}/ping", headers=server.headers, timeout=10)
        assert response.status_code == 200, response.text
        if response.json()["status"] == "Degraded":
            seen.append(response.json())
        elif seen:
            break
        time.sleep(0.05)
    return seen


def _print_timeline(killed_at: float, outcomes: dict[str, Outcome], back: float, degraded: list[dict]) -> None:
    print("\n[kill -9 of replica 1 of 3]")
    for name, outcome in outcomes.items():
        print(f"  {name}: {outcome.ending} {outcome.ended_at - killed_at:.2f} s after the kill")
    print(f"  replica 1 serving again {back:.2f} s after the kill; /ping said Degraded {len(degraded)} times")
    if degraded:
        print(f"  e.g. {degraded[0]}")


HF_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 8,
    "jobQueueSize": 16,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "hf",
        "n_positions": 512,
        "max_new_tokens": 200,
        "cpu_threads": 1,
    },
    "micro_batching": {"micro_batch_size": 1},
}


@pytest.fixture(scope="module")
def hf_replicas(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    config = with_mode(HF_CONFIG, "continuous", n_slots=4)
    config["scheduler"] = {**config["scheduler"], "replicas": 2}
    config["batchSize"] = 16
    server = start_torchserve(tmp_path_factory.mktemp("ts-hf-replicas"), tiny_model_dir, config)
    try:
        yield server
    finally:
        stop_and_check(server)


@pytest.mark.timeout(300)
def test_greedy_text_is_the_same_on_every_replica(hf_replicas: TorchServe):
    server = hf_replicas
    greedy = {"prompt": "The capital of France is", "max_new_tokens": 24, "stream": False}
    counted = dispatched(server)
    mates = [
        InBackground(
            server.predictions_url,
            {"prompt": f"mate {i} " * (i + 1), "max_new_tokens": 40, "do_sample": True, "temperature": 0.9, "seed": i},
            server.headers,
        )
        for i in range(3)
    ]
    same = [InBackground(server.predictions_url, greedy, server.headers) for _ in range(4)]
    texts = [o.join() for o in same]
    for mate in mates:
        assert mate.join().status == 200
    alone = httpx.post(server.predictions_url, json=greedy, headers=server.headers, timeout=60)
    assert alone.status_code == 200
    assert {o.status for o in texts} == {200}
    bodies = {o.events[-1]["text"] for o in texts} | {alone.json()["text"]}
    assert len(bodies) == 1, f"greedy texts differ across replicas or batch-mates: {bodies}"
    assert set(dispatched(server) - counted) == {0, 1}, "the requests did not reach both replicas"


@pytest.mark.timeout(120)
def test_logprobs_and_bad_requests_through_replicas(hf_replicas: TorchServe):
    server = hf_replicas
    url = openai_url(server)
    ok = httpx.post(
        url,
        json={"model": "llama", "prompt": "Hello", "max_tokens": 5, "logprobs": 2, "temperature": 0},
        headers=server.headers,
        timeout=60,
    )
    assert ok.status_code == 200, ok.text
    logprobs = ok.json()["choices"][0]["logprobs"]
    assert len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 5
    for chosen, top in zip(logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert top and chosen == max(top.values()) <= 0  # greedy: the chosen token is the most likely
    bad = httpx.post(
        url, json={"model": "llama", "prompt": "Hello", "max_tokens": -1}, headers=server.headers, timeout=60
    )
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens", bad.text
