"""Replicas without a model: dispatch, core placement, the Sequence hand-over between a
replica and its worker, and the replica set's bookkeeping with stand-in processes (what is
sent where, which requests a dead replica takes with it, restarts, giving up)."""

from __future__ import annotations

import pickle
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from handler.config import ServingConfig
from handler.engine.sequence import Sequence, State
from handler.errors import ConfigError, EngineError, InvalidRequest
from handler.neuron import cores
from handler.replicas import replica_set as replica_set_module
from handler.replicas.dispatch import choose
from handler.replicas.protocol import Abort, ModelFacts, Ready, ReplicaSpec, StartFailed, Stepped, Submit
from handler.replicas.replica_set import ReplicaSet
from handler.request import GenerationRequest, TokenChoice


# -- dispatch -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("loads", "chosen"),
    [
        ([0, 0, 0], 0),
        ([2, 1, 3], 1),
        ([1, 1, 0], 2),
        ([2, 1, 1], 1),  # a tie goes to the lower index
        ([None, 3, 3], 1),  # a replica that is not serving gets nothing
        ([0, None, 1], 0),
        ([None, None], None),
        ([], None),
    ],
)
def test_fewest_sequences_ties_to_the_lowest_index(loads, chosen):
    assert choose(loads) == chosen


# -- placement ------------------------------------------------------------------------------
def test_the_worker_claims_replicas_x_tp_cores_and_splits_them(tmp_path: Path):
    placement = cores.place(None, 1, 2, 8, lock_dir=tmp_path, replicas=3)
    assert placement.cores == (0, 1, 2, 3, 4, 5)
    assert cores.split(placement.cores, 3, 2) == [(0, 1), (2, 3), (4, 5)]
    # a second worker of the same layout would need 6 more: only cores 6-7 are left
    with pytest.raises(ConfigError, match="held by other processes"):
        cores.place(None, 1, 2, 8, lock_dir=tmp_path, replicas=3)
    placement.release()


def test_replicas_within_the_operators_visible_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(cores.VISIBLE_CORES_ENV, "4-7,12-15")
    monkeypatch.delenv(cores.OPERATOR_CORES_ENV, raising=False)
    monkeypatch.setenv(cores.LOCK_DIR_ENV, str(tmp_path))
    placement, within = cores.claim(None, 1, 4, None, replicas=2)
    assert placement.cores == (4, 5, 6, 7, 12, 13, 14, 15)
    assert "NEURON_RT_VISIBLE_CORES=4-7,12-15" in within
    assert cores.split(placement.cores, 2, 4) == [(4, 5, 6, 7), (12, 13, 14, 15)]
    placement.release()


def test_too_many_replicas_are_refused_with_the_numbers():
    with pytest.raises(ConfigError) as refused:
        cores.check_fits(1, 8, 12, replicas=3)
    message = str(refused.value)
    assert "3 replicas x tp_degree 8 need 24 NeuronCores but 12 are available" in message
    assert "at most 1 replicas at tp_degree 8" in message and "tp_degree <= 4 for 3 replicas" in message


def test_gpu_id_picks_a_range_of_replicas_x_tp():
    assert cores.place(1, 2, 2, 8, replicas=2).cores == (4, 5, 6, 7)


# -- config ---------------------------------------------------------------------------------
def _config(**scheduler) -> dict:
    return {
        "continuousBatching": True,
        "batchSize": 16,
        "maxBatchDelay": 1,
        "jobQueueSize": 64,
        "handler": {"model_checkpoint_dir": "model"},
        "scheduler": {"n_slots": 4, **scheduler},
    }


def test_replicas_config():
    assert ServingConfig.from_model_yaml(_config()).scheduler.replicas == 1
    config = ServingConfig.from_model_yaml(_config(replicas=4))
    assert config.scheduler.total_slots == 16
    with pytest.raises(ConfigError, match=r"batchSize \(16\) is below scheduler.replicas x n_slots \(5 x 4 = 20\)"):
        ServingConfig.from_model_yaml(_config(replicas=5))
    static = {**_config(mode="static", replicas=2), "continuousBatching": False}
    with pytest.raises(ConfigError, match=r"scheduler.replicas \(2\) needs scheduler.mode continuous"):
        ServingConfig.from_model_yaml(static)
    with pytest.raises(ConfigError, match=r"scheduler\.replicas: Input should be greater than or equal to 1"):
        ServingConfig.from_model_yaml(_config(replicas=0))


def test_the_config_and_errors_survive_pickling():
    config = ServingConfig.from_model_yaml(_config(replicas=2))
    assert pickle.loads(pickle.dumps(config)) == config
    error = pickle.loads(pickle.dumps(InvalidRequest("bad", "max_tokens")))
    assert (type(error), error.message, error.param, error.status) == (InvalidRequest, "bad", "max_tokens", 400)


# -- the Sequence hand-over ----------------------------------------------------------------------
class CharTokenizer:
    """One character per token id (ord), enough for the detokenizer."""

    def decode(self, ids, skip_special_tokens=True, **_):
        return "".join(chr(i) for i in ids if i != 0)

    def convert_ids_to_tokens(self, ids):
        return [chr(i) for i in ids]


def _sequence(request: GenerationRequest, request_id: str = "r") -> Sequence:
    return Sequence(request, [ord("a")], CharTokenizer(), frozenset({0}), request_id)


@pytest.mark.parametrize("stop", [(), ("lo w",)])
def test_the_workers_copy_adopts_what_the_replica_decided(stop):
    request = GenerationRequest("a", 30, stop=stop, logprobs=1)
    replica, worker = _sequence(request), _sequence(request)
    reported, texts = 0, []
    for char in "hello world!":
        replica.take(TokenChoice(ord(char), -0.5, ((ord(char), -0.5),)))
        if char in "o!" or replica.finished:  # reports come now and then, not every token
            progress = pickle.loads(pickle.dumps(replica.progress_since(reported)))
            texts.append(worker.adopt(progress))
            reported = len(replica.token_ids)
        if replica.finished:
            break
    assert worker.full_text == replica.full_text == "".join(texts)
    assert (worker.state, worker.finish_reason) == (replica.state, replica.finish_reason)
    assert worker.completion_tokens == replica.completion_tokens and worker.choices == replica.choices
    if stop:
        assert worker.full_text == "hel" and str(worker.finish_reason) == "stop"


def test_progress_out_of_order_is_refused():
    replica, worker = _sequence(GenerationRequest("a", 5)), _sequence(GenerationRequest("a", 5))
    replica.take(TokenChoice(ord("x")))
    replica.take(TokenChoice(ord("y")))
    with pytest.raises(ValueError, match="progress after 1 tokens"):
        worker.adopt(replica.progress_since(1))


# -- the replica set, with stand-in processes ---------------------------------------------------------
FACTS = ModelFacts("sim", 4, 128, None, None, frozenset({0}))


@dataclass
class StandIn:
    """A replica process that never runs: it records what it was sent."""

    spec: ReplicaSpec
    on_message: object
    on_exit: object
    sent: list = field(default_factory=list)
    killed: bool = False
    pid: int = 0

    def send(self, message) -> bool:
        self.sent.append(message)
        return True

    def kill(self) -> None:
        self.killed = True

    def stop(self, timeout_s: float) -> None:
        pass

    def say(self, message) -> None:
        self.on_message(self, message)

    def exit(self, how: str = "killed by SIGKILL") -> None:
        self.on_exit(self, how)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Fixture:
    def __init__(self, count: int, step_timeout_s: float = 60.0, config: ServingConfig | None = None) -> None:
        self.processes: list[StandIn] = []
        self.clock = Clock()
        self.set = ReplicaSet(
            [ReplicaSpec(k, config, None) for k in range(count)], step_timeout_s, self._spawn, clock=self.clock
        )
        self.health = []
        self.set.on_health = lambda: self.health.append(self.set.health())
        self.answer_ready = True  # each new process says Ready, as a replica after its warm-up

    def _spawn(self, spec, on_message, on_exit) -> StandIn:
        process = StandIn(spec, on_message, on_exit, pid=100 + len(self.processes))
        self.processes.append(process)
        if self.answer_ready:  # from another thread, as a reader would
            threading.Timer(0.01, process.say, args=(Ready(FACTS, process.pid, 0.1),)).start()
        return process

    def latest(self, index: int) -> StandIn:
        return [p for p in self.processes if p.spec.index == index][-1]

    def submit(self, request_id: str) -> Sequence:
        sequence = _sequence(GenerationRequest("a", 10), request_id)
        self.set.submit(sequence)
        return sequence

    def wait_until(self, condition, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)


def test_dispatch_cancel_and_progress_reach_the_right_replica():
    f = Fixture(3)
    f.set.launch_all()
    sequences = [f.submit(f"r{i}") for i in range(5)]
    assert [f.set.replica_of(s.request_id) for s in sequences] == [0, 1, 2, 0, 1]
    assert [m.request_id for m in f.latest(0).sent if isinstance(m, Submit)] == ["r0", "r3"]
    f.set.abort("r3")
    assert isinstance(f.latest(0).sent[-1], Abort) and f.latest(0).sent[-1].request_id == "r3"
    assert f.set.replica_of(f.submit("r5").request_id) == 0  # replica 0 is down to one sequence again

    # replica 1 reports r1's first tokens and r4's end
    twin1, twin4 = _sequence(GenerationRequest("a", 10), "r1"), _sequence(GenerationRequest("a", 1), "r4")
    twin1.take(TokenChoice(ord("h")))
    twin4.take(TokenChoice(ord("z")))
    f.latest(1).say(Stepped((twin1.progress_since(0), twin4.progress_since(0)), (), 2, 0))
    updates = f.set.take(["r1", "r4"])
    assert (updates["r1"].text, updates["r1"].ended) == ("h", False)
    assert updates["r4"].ended and str(updates["r4"].sequence.finish_reason) == "length"
    assert f.set.replica_of("r4") is None and f.set.occupied == 2 and f.set.steps == 1
    f.set.stop()


def test_a_dead_replica_fails_its_own_sequences_only_and_restarts(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(replica_set_module, "SUPERVISE_EVERY_S", 0.01)
    f = Fixture(2)
    f.set.launch_all()
    f.set.start()
    mine, theirs = f.submit("a"), f.submit("b")
    first = f.latest(1)
    first.exit("killed by SIGKILL")
    assert theirs.state is State.FAILED and "replica 1 (pid 101) killed by SIGKILL" in theirs.error.message
    assert isinstance(theirs.error, EngineError) and mine.state is State.RUNNING
    assert f.set.take(["b"])["b"].ended and f.set.health().ready == 1
    assert f.health[-1].problem.startswith("1 of 2 replicas serving")
    assert f.set.replica_of(f.submit("c").request_id) == 0  # nothing goes to the dead one
    f.clock.now += 1.0  # past the back-off
    f.wait_until(lambda: f.latest(1) is not first and f.set.health().ready == 2)
    assert f.health[-1].problem is None
    assert f.set.replica_of(f.submit("d").request_id) == 1
    f.set.stop()


def test_a_replica_that_keeps_failing_to_start_gives_up(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(replica_set_module, "SUPERVISE_EVERY_S", 0.01)
    f = Fixture(2)
    f.set.launch_all()
    f.set.start()
    f.answer_ready = False
    f.latest(1).exit("killed by SIGKILL")
    for attempt in range(replica_set_module.MAX_FAILED_STARTS):
        f.clock.now += 10
        f.wait_until(lambda started=3 + attempt: len(f.processes) == started)
        starting = f.latest(1)
        starting.say(StartFailed("RuntimeError: the device is gone"))
        starting.exit("exited with status 1")
    f.clock.now += 10
    f.wait_until(lambda: f.set.health().failed is not None)
    failed = f.set.health().failed
    assert "while starting: RuntimeError: the device is gone" in failed and "3 failed starts in a row" in failed
    assert f.health[-1].failed == failed
    f.set.stop()


def test_a_busy_replica_silent_past_the_step_timeout_is_killed(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(replica_set_module, "SUPERVISE_EVERY_S", 0.01)
    f = Fixture(2, step_timeout_s=30)
    f.set.launch_all()
    f.set.start()
    f.clock.now += 100  # long idle: no report is due from a replica without work
    f.submit("a")
    time.sleep(0.1)
    assert not f.latest(0).killed
    f.clock.now += 31
    f.wait_until(lambda: f.latest(0).killed)
    assert not f.latest(1).killed
    f.set.stop()


def test_the_first_replica_starts_alone_then_the_others():
    f = Fixture(3)
    started = []
    spawn = f._spawn

    def recording(spec, on_message, on_exit):
        started.append((spec.index, f.set.health().ready))  # how many served when it was spawned
        return spawn(spec, on_message, on_exit)

    f.set._process_factory = recording
    f.set.launch_all()
    assert started == [(0, 0), (1, 1), (2, 1)]  # 1 and 2 only once 0 served, then together
    f.set.stop()


def test_a_failed_first_start_raises_with_the_cause():
    f = Fixture(2)

    def failing(spec, on_message, on_exit):
        process = StandIn(spec, on_message, on_exit)
        f.processes.append(process)

        def fail():
            process.say(StartFailed("ConfigError: model-config.yaml: scheduler.n_slots (4) does not match"))
            process.exit("exited with status 1")

        threading.Timer(0.01, fail).start()
        return process

    f.set._process_factory = failing
    with pytest.raises(replica_set_module.ReplicaStartError, match=r"replica 0 failed to start: .*does not match"):
        f.set.launch_all()
    assert len(f.processes) == 1
