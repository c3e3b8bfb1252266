"""Readiness and failed starts against a real torchserve (issue 10, items 1 and 7).

- /ping (the plugin in serving/plugins) says 503 "Loading" from `torchserve --start` until the
  worker has finished its warm-up, then 200; TorchServe's own /ping said 200 as soon as the
  worker process existed. The sim backend's warm-up is made 3 s longer by a failpoint.
- drain.json in the state dir turns /ping to 503 "Draining"; removing it, back to 200.
- replicas-<pid>.json of a live process turns /ping to 200 "Degraded" or 503 "Unhealthy" with
  its cause (Unhealthy wins); that of a dead process, or a malformed one, changes nothing.
- A worker whose model fails to load answers requests at once with a 503 JSON naming the cause,
  /ping says 503 "Unhealthy" with that cause (quotes, newlines and non-ASCII survive the
  plugin's JSON), and TorchServe restarts the worker after the hold.
- `make serve` on a model that fails to load prints the cause from the model log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from handler.failpoints import INIT_ENV, WARMUP_ENV
from handler.serving.init_failure import HOLD_ENV
from handler.serving.state import (
    DRAIN_FILE,
    clear_replica_health,
    replicas_marker,
    write_drain,
    write_replica_health,
)
from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.make_checkout import free_ports, make_checkout, make_command
from tests.support.modes import MODES, with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
WARMUP_DELAY_S = 3.0
POLL_S = 0.05
SIM_CONFIG: dict[str, Any] = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 8,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "sim",
        "n_positions": 1024,
        "default_max_new_tokens": 8,
        "max_new_tokens": 64,
        "sim": {"profile": str(PROFILE), "time_scale": 0.0},
    },
}
# What the failing worker's cause carries through failed-<pid>.json, the plugin's JSON and the 503 body.
INJECTED = 'injected "load" failure\nsecond line\twith a tab, a backslash \\ and non-ASCII: é ☃'
LOG_TIME = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d,\d{3}) ")
WARMUP_LINE = f"{WARMUP_ENV}: the warm-up takes"
READY_LINE = re.compile(r"backend \w+ ready in")


@dataclass
class Ping:
    sent: float  # time.time()
    received: float
    status: int | None  # None: no answer (the frontend not listening yet)
    body: Any = None

    @property
    def state(self) -> str:
        if self.status is None:
            return "no answer"
        if isinstance(self.body, dict) and "status" in self.body:
            return f"{self.status} {self.body['status']}"
        return f"{self.status} (not the plugin: {str(self.body)[:60]})"


@dataclass
class Startup:
    started: float  # when `torchserve --start` returned
    pings: list[Ping] = field(default_factory=list)
    first_request: tuple[float, int] | None = None  # (seconds, status) of a request sent at the first 200

    def first(self, status: int) -> Ping | None:
        return next((p for p in self.pings if p.status == status), None)

    def last(self, status: int) -> Ping | None:
        return next((p for p in reversed(self.pings) if p.status == status), None)


def ping_once(client: httpx.Client, server: TorchServe) -> Ping:
    sent = time.time()
    try:
        response = client.get(f"{server.url}/ping", headers=server.headers)
    except (httpx.HTTPError, ValueError):  # ValueError: key_file.json being written
        return Ping(sent, time.time(), None)
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return Ping(sent, time.time(), response.status_code, body)


def log_time(server: TorchServe, needle: str | re.Pattern[str]) -> float | None:
    """time.time() of the first model_log line matching needle (the frontend's log4j timestamp)."""
    for line in server.log_text("model_log.log").splitlines():
        if (needle.search(line) if isinstance(needle, re.Pattern) else needle in line) and LOG_TIME.match(line):
            return datetime.strptime(LOG_TIME.match(line)[1], "%Y-%m-%dT%H:%M:%S,%f").timestamp()
    return None


def watch_startup(server: TorchServe, started: float, healthy_for_s: float = 1.0, timeout_s: float = 180) -> Startup:
    """Ping every POLL_S until /ping has said 200 for healthy_for_s; at the first 200, send one request."""
    startup = Startup(started)
    healthy_since = None
    with httpx.Client(timeout=5) as client:
        while time.time() - started < timeout_s:
            ping = ping_once(client, server)
            startup.pings.append(ping)
            if ping.status == 200 and healthy_since is None:
                healthy_since = time.time()
                body = {"prompt": "Today the weather is", "max_new_tokens": 4, "stream": False}
                t0 = time.perf_counter()
                response = client.post(server.predictions_url, json=body, headers=server.headers, timeout=60)
                startup.first_request = (time.perf_counter() - t0, response.status_code)
            if healthy_since is not None and time.time() - healthy_since >= healthy_for_s:
                return startup
            time.sleep(POLL_S)
    raise AssertionError(f"/ping never said 200 for {healthy_for_s} s: last {startup.pings[-1].state}")


@pytest.fixture(scope="module")
def warming(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TorchServe, Startup]]:
    """A sim-backend torchserve whose warm-up takes WARMUP_DELAY_S longer, watched from its start."""
    workdir = tmp_path_factory.mktemp("torchserve-readiness")
    config = with_mode(SIM_CONFIG, "continuous", n_slots=8)
    server = start_torchserve(workdir, tiny_model_dir, config, env={WARMUP_ENV: str(WARMUP_DELAY_S)}, wait=False)
    try:
        yield server, watch_startup(server, time.time())
    finally:
        server.stop()


def timeline(server: TorchServe, startup: Startup) -> dict[str, float | None]:
    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - startup.started, 3)

    first_503, last_503, first_200 = startup.first(503), startup.last(503), startup.first(200)
    answered = next((p for p in startup.pings if p.status is not None), None)
    return {
        "first answer": rel(answered and answered.received),
        "first 503": rel(first_503 and first_503.received),
        "warm-up delay line": rel(log_time(server, WARMUP_LINE)),
        "warm-up done line": rel(log_time(server, READY_LINE)),
        "last 503": rel(last_503 and last_503.received),
        "first 200": rel(first_200 and first_200.received),
    }


def test_ping_is_503_until_the_warmup_has_finished_then_200(warming):
    server, startup = warming
    marks = timeline(server, startup)
    states: dict[str, int] = {}
    for ping in startup.pings:
        states[ping.state] = states.get(ping.state, 0) + 1
    print(f"\nping timeline, seconds after `torchserve --start` returned: {marks}")
    print(f"answers: {states}; a request sent at the first 200: {startup.first_request}")

    delay_at, ready_at = log_time(server, WARMUP_LINE), log_time(server, READY_LINE)
    assert delay_at is not None and ready_at is not None, "warm-up lines missing from the model log"
    first_200 = startup.first(200)
    # Not ready while the worker was warming up: every answer between the failpoint's line and
    # the warm-up-done line was 503 Loading (TorchServe's own /ping said 200 all along).
    during = [p for p in startup.pings if delay_at <= p.sent and p.received <= ready_at and p.status is not None]
    assert len(during) >= 10, f"only {len(during)} answers during the {WARMUP_DELAY_S} s warm-up"
    assert {p.state for p in during} == {"503 Loading"}
    assert "warming up" in during[0].body["message"]
    # No 200 before the warm-up line (0.5 s: the frontend stamps the worker's line when it reads it).
    assert first_200.received >= ready_at - 0.5, marks
    assert first_200.body == {"status": "Healthy"}
    # Ready means ready: a request sent at the first 200 is answered, and /ping stays 200.
    assert startup.first_request is not None and startup.first_request[1] == 200
    after = startup.pings[startup.pings.index(first_200) :]
    assert {p.status for p in after} == {200}
    # Before the model was registered or its worker loaded, the plugin said so (no other answer).
    assert all(p.status in (None, 400, 503) for p in startup.pings[: startup.pings.index(first_200)])
    assert all(p.state == "503 Loading" for p in startup.pings if p.status == 503)


def test_ping_needs_the_key_where_token_auth_is_on(warming):
    server, _ = warming
    response = httpx.get(f"{server.url}/ping", timeout=10)
    if has_secure_defaults():  # 0.12: token auth covers every inference route, /ping (a plugin) included
        assert response.status_code == 400 and "InvalidKeyException" in response.text
    else:  # 0.11 has no token authorization
        assert response.status_code == 200
    # what an exec probe runs: the client reads the key when it runs (TorchServe writes a new one at each start)
    client = [sys.executable, "-m", "scripts.serve.client", "--url", server.url]
    done = subprocess.run(
        [*client, "--key-file", str(server.key_file), "ping"], capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert (done.returncode, done.stdout.strip()) == (0, '200 {"status": "Healthy"}'), done.stderr


def test_drain_file_turns_ping_to_draining_and_back(warming):
    server, _ = warming
    assert server.state_dir is not None
    write_drain(server.state_dir, grace_s=600)
    try:
        response = httpx.get(f"{server.url}/ping", headers=server.headers, timeout=10)
        assert response.status_code == 503
        assert response.headers["content-type"].startswith("application/json")
        assert response.json()["status"] == "Draining" and response.json()["message"]
    finally:
        (server.state_dir / DRAIN_FILE).unlink()
    response = httpx.get(f"{server.url}/ping", headers=server.headers, timeout=10)
    assert (response.status_code, response.json()) == (200, {"status": "Healthy"})


def ping_json(server: TorchServe) -> tuple[int, Any]:
    response = httpx.get(f"{server.url}/ping", headers=server.headers, timeout=10)
    assert response.headers["content-type"].startswith("application/json")
    return response.status_code, response.json()


def dead_pid() -> int:
    done = subprocess.Popen(["sleep", "0"])
    done.wait()
    try:
        os.kill(done.pid, 0)
    except ProcessLookupError:
        return done.pid
    pytest.fail(f"pid {done.pid} of an exited process is alive again (reused)")


# The worker's cause as it reaches /ping: quotes, newline, backslash and non-ASCII intact.
REPLICA_CAUSE = 'replica 2 of 4 restarting after "NeuronCore" error\nexit code -9 \\ é'


def test_replica_health_markers_turn_ping_degraded_or_unhealthy_while_their_process_lives(warming):
    server, _ = warming
    state_dir = server.state_dir
    assert state_dir is not None
    assert ping_json(server) == (200, {"status": "Healthy"})
    me = os.getpid()  # the marker is only meaningful while its pid lives: this test process does
    other = subprocess.Popen(["sleep", "300"])  # a second live "worker"
    others = [replicas_marker(state_dir, other.pid), replicas_marker(state_dir, dead_pid())]
    try:
        write_replica_health(state_dir, "Degraded", REPLICA_CAUSE)
        assert ping_json(server) == (200, {"status": "Degraded", "message": f"worker {me}: {REPLICA_CAUSE}"})

        write_replica_health(state_dir, "Unhealthy", "no replica serves")
        assert ping_json(server) == (503, {"status": "Unhealthy", "message": f"worker {me}: no replica serves"})

        # one worker Degraded, another Unhealthy: Unhealthy wins
        write_replica_health(state_dir, "Degraded", REPLICA_CAUSE)
        others[0].write_text('{"status": "Unhealthy", "cause": "all down"}')
        assert ping_json(server) == (503, {"status": "Unhealthy", "message": f"worker {other.pid}: all down"})

        # malformed markers of live processes are skipped: the Degraded one still speaks
        others[0].write_text('{"status": "Broken", "cause": "not a status"}')
        assert ping_json(server)[1]["status"] == "Degraded"
        others[0].write_text("{not json")
        assert ping_json(server)[1]["status"] == "Degraded"

        # a marker left behind by a dead process is ignored, whatever it says
        clear_replica_health(state_dir)
        others[0].unlink()
        others[1].write_text('{"status": "Unhealthy", "cause": "left behind"}')
        assert ping_json(server) == (200, {"status": "Healthy"})
        others[1].unlink()

        write_replica_health(state_dir, "Degraded", REPLICA_CAUSE)
        assert ping_json(server) == (200, {"status": "Degraded", "message": f"worker {me}: {REPLICA_CAUSE}"})
        clear_replica_health(state_dir)  # every replica serves again
        assert ping_json(server) == (200, {"status": "Healthy"})
    finally:
        clear_replica_health(state_dir)
        for marker in others:
            marker.unlink(missing_ok=True)
        other.kill()
        other.wait()


def wait_for(predicate, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(POLL_S)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def markers(server: TorchServe) -> set[str]:
    return {p.name for p in server.state_dir.glob("failed-*.json")}


@pytest.mark.parametrize("mode", MODES)
def test_a_worker_that_cannot_load_answers_503_naming_the_cause_and_restarts(tiny_model_dir, tmp_path, mode):
    env = {INIT_ENV: INJECTED, HOLD_ENV: "15"}
    config = with_mode(SIM_CONFIG, mode, n_slots=8)
    server = start_torchserve(tmp_path / "ts", tiny_model_dir, config, env=env, wait=False)
    cause = f"InjectedFailure: {INJECTED}"
    try:
        with httpx.Client(timeout=10) as client:
            unhealthy = wait_for(
                lambda: (p := ping_once(client, server)).state == "503 Unhealthy" and p, 120, "/ping Unhealthy"
            )
        assert cause in unhealthy.body["message"]  # quotes, newline, tab, backslash, é ☃ intact
        first_marker = markers(server)
        assert len(first_marker) == 1

        t0 = time.perf_counter()
        response = httpx.post(server.predictions_url, json={"prompt": "hi"}, headers=server.headers, timeout=60)
        seconds = time.perf_counter() - t0
        print(f"\n{mode}: a request to the failed worker was answered {response.status_code} in {seconds:.3f} s")
        assert response.status_code == 503 and seconds < 5
        assert response.headers["content-type"].startswith("application/json")
        assert int(response.headers["retry-after"]) >= 1
        error = response.json()["error"]
        assert error["type"] == "model_load_failed" and cause in error["message"]

        openai = httpx.post(
            f"{server.predictions_url}/1.0/v1/completions",
            json={"model": server.model_name, "prompt": "hi"},
            headers=server.headers,
            timeout=60,
        )
        assert openai.status_code == 503 and openai.json()["error"]["type"] == "model_load_failed"

        # After the hold the worker removes its marker and exits; TorchServe starts a new one,
        # which fails again: a marker with another pid.
        wait_for(lambda: markers(server) - first_marker, 90, "a restarted worker's failed marker")
        assert "exiting after the failed model load" in server.log_text()
    finally:
        server.stop()


def test_make_serve_prints_why_the_worker_failed(tiny_model_dir, tmp_path):
    """`make serve` on a config the handler rejects: it stops at once and prints the cause
    (the traceback in the model log), not only ts_log's "Worker died"."""
    if not has_secure_defaults():
        pytest.skip("make serve refuses TorchServe 0.11 (no token authorization)")
    checkout = make_checkout(tmp_path / "checkout")  # make serve writes logs/, build/ and key_file.json there
    config = yaml.safe_load((REPO / "model-config.yaml").read_text())
    config["handler"]["n_positions"] = "eight hundred"
    (checkout / "bad-config.yaml").write_text(yaml.safe_dump(config))
    ports = [f"{name}={port}" for name, port in free_ports().items()]
    command = [*make_command(), "serve"]
    command += [f"MODEL_DIR={tiny_model_dir}", "MODEL_CONFIG=bad-config.yaml", "DRAIN_GRACE_S=0", *ports]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, timeout=300, env={**os.environ})
    finally:  # never leave it running, whatever happened
        subprocess.run(
            [*make_command(), "stop", "DRAIN_GRACE_S=0"],
            cwd=checkout,
            capture_output=True,
            timeout=120,
        )
    output = done.stdout + done.stderr
    print(f"\nmake serve failed after {time.perf_counter() - t0:.1f} s; its last lines:\n" + output[-1500:])
    assert done.returncode != 0
    assert "the model failed to load" in output
    assert "Cause, from logs/model_log.log" in output and "Traceback" in output
    assert "handler.n_positions" in output and "eight hundred" in output
