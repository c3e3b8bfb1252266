"""R replica processes as one engine: the interface handler/serving/continuous.py drives a
`StepEngine` through (`submit`, `abort`, `fail_all`, `take`, `wait`, `take_records`, the
gauges), plus dispatch, fault isolation and restarts.

- A new request goes to the serving replica with the fewest sequences (dispatch.py); the
  set remembers which replica holds it, so a cancel reaches that one.
- Each replica reports after every step (`Stepped`); the reader thread applies each
  sequence's `Progress` to the worker's copy of it and fills its outbox, as the step loop
  does in one process.
- A replica that exits (kill -9, OOM, a crash) is seen at once (EOF on its socket): its own
  sequences end with an EngineError, the others are untouched; the supervisor starts it
  again after a back-off (loading the saved artifacts: no compile) and dispatches to it once
  it says Ready (after its warm-up). One busy but silent for `step_timeout_s` (a hung
  device call) is killed, which ends its sequences the same way.
- A replica that fails to start MAX_FAILED_STARTS times in a row gives up: `Health.failed`
  says why, and the serving layer fails the worker with it.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path

from handler.engine.between_steps import failed
from handler.engine.outbox import Outboxes, Update
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepRecord
from handler.errors import EngineError, ServingError
from handler.lora.adapters import AdapterError
from handler.replicas.adapter_loads import PendingLoad
from handler.replicas.dispatch import choose
from handler.replicas.process import ReplicaProcess
from handler.replicas.protocol import (
    Abort,
    AdapterLoaded,
    LoadAdapter,
    ModelFacts,
    Ready,
    ReplicaSpec,
    StartFailed,
    Stepped,
    Submit,
    UnloadAdapter,
)

logger = logging.getLogger(__name__)

MAX_FAILED_STARTS = 3
RESTART_BACKOFF_S = (0.5, 2.0, 5.0)  # before the 1st, 2nd, 3rd+ restart in a row
SUPERVISE_EVERY_S = 0.2
STOP_TIMEOUT_S = 10.0


class ReplicaStartError(RuntimeError):
    """A replica could not start (the first time, or MAX_FAILED_STARTS times in a row)."""


class _State(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    DOWN = "down"


@dataclass
class _Replica:
    spec: ReplicaSpec
    process: ReplicaProcess | None = None
    state: _State = _State.DOWN
    requests: set[str] = field(default_factory=set)
    occupied: int = 0
    waiting: int = 0
    heard_at: float = 0.0  # its last report, or when it last got work while it had none
    failed_starts: int = 0  # in a row
    restart_at: float = 0.0
    cause: str = ""  # why it is down, or why its start failed
    changed: threading.Event = field(default_factory=threading.Event)  # Ready or exit, for launch_all


@dataclass(frozen=True)
class Health:
    """The replicas as the readiness probe and the metrics see them."""

    total: int
    ready: int
    occupancy: tuple[int | None, ...]  # slots occupied per replica; None while it is not serving
    problem: str | None  # why some replica is not serving
    failed: str | None  # a replica gave up starting: the worker must fail


class ReplicaSet:
    def __init__(
        self,
        specs: list[ReplicaSpec],
        step_timeout_s: float,
        process_factory: Callable[..., ReplicaProcess] = ReplicaProcess,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._specs = specs
        self._step_timeout_s = step_timeout_s
        self._process_factory = process_factory
        self._clock = clock
        self._changed = threading.Condition()  # guards everything below
        self._outboxes = Outboxes(self._changed)
        self._replicas = [_Replica(spec) for spec in specs]
        self._owner: dict[str, int] = {}  # request id: the replica generating it
        self._records: list[StepRecord] = []
        self._failed: str | None = None
        self._loading: dict[str, PendingLoad] = {}  # LoRA adapters being loaded at run time, by name
        self._stopping = False
        self._supervisor: threading.Thread | None = None
        self.facts: ModelFacts | None = None
        self.steps = 0
        self.on_idle: Callable[[], None] | None = None
        # Called (from the replicas' reader threads and the supervisor) when a replica went down, came
        # back or gave up; `health()` says how things stand then.
        self.on_health: Callable[[], None] | None = None

    # -- start-up --------------------------------------------------------------------------
    def launch_all(self) -> ModelFacts:
        """Replica 0 first (it compiles, or loads, the artifacts), then the others at once
        (they load what it compiled): never two compiles. Raises ReplicaStartError with the
        first failure's cause."""
        self._launch(0)
        self._await_ready([0])
        rest = list(range(1, len(self._replicas)))
        for index in rest:
            self._launch(index)
        self._await_ready(rest)
        assert self.facts is not None
        return self.facts

    def _launch(self, index: int) -> None:
        replica = self._replicas[index]
        with self._changed:
            replica.state = _State.STARTING
            replica.cause = ""
            replica.changed.clear()
        logger.info(
            "starting replica %d%s",
            index,
            "" if replica.spec.cores is None else f" on NeuronCores {list(replica.spec.cores)}",
        )
        process = self._process_factory(replica.spec, self._on_message, self._on_exit)
        with self._changed:
            replica.process = process

    def _await_ready(self, indexes: list[int]) -> None:
        for index in indexes:
            replica = self._replicas[index]
            replica.changed.wait()
            if replica.state is not _State.READY:
                raise ReplicaStartError(f"replica {index} failed to start: {replica.cause}")

    # -- the engine interface ----------------------------------------------------------------
    def start(self) -> None:
        """Start supervising (restarts, hung replicas)."""
        if self._supervisor is None:
            self._supervisor = threading.Thread(target=self._supervise, name="replica-supervisor", daemon=True)
            self._supervisor.start()

    def submit(self, sequence: Sequence) -> None:
        with self._changed:
            box = self._outboxes.open(sequence)
            loads = [len(r.requests) if r.state is _State.READY else None for r in self._replicas]
            index = choose(loads)
            if index is None:
                sequence.fail(EngineError(f"no replica of this worker is serving: {self._problem() or 'starting'}"))
                box.ended = True
                self._changed.notify_all()
                return
            replica = self._replicas[index]
            if not replica.requests:
                replica.heard_at = self._clock()
            replica.requests.add(sequence.request_id)
            self._owner[sequence.request_id] = index
            process = replica.process
        logger.info("request %s to replica %d (sequences per replica: %s)", sequence.request_id, index, loads)
        assert process is not None
        process.send(
            Submit(sequence.request_id, sequence.request, tuple(sequence.prompt_ids), sequence.received_at)
        )  # a replica that died meanwhile fails the request when its exit is seen

    def abort(self, request_id: str) -> None:
        with self._changed:
            self._outboxes.pop(request_id)
            process = self._forget(request_id)
        if process is not None:
            process.send(Abort(request_id))

    def admissions_done(self) -> None:
        """Nothing to release: each replica steps on in its own process; a newcomer reaches it by
        message and joins its next step, held for no caller (handler/engine/step_engine.py)."""

    def fail_all(self, error: ServingError) -> None:
        """End every sequence with `error` now (the drain deadline passed); the replicas drop them."""
        aborts = []
        with self._changed:
            for request_id, box in self._outboxes.items():
                if box.ended:
                    continue
                box.sequence.fail(error)
                box.ended = True
                aborts.append((request_id, self._forget(request_id)))
            self._changed.notify_all()
        if aborts:
            logger.info("%d sequence(s) ended: %s", len(aborts), error.message)
        for request_id, process in aborts:
            if process is not None:
                process.send(Abort(request_id))

    def load_adapter(self, name: str, path: Path, max_rank: int) -> Future[None]:
        """On every serving replica (adapter_loads.py); a replica restarted later loads it at its start."""
        with self._changed:
            serving = {i: r.process for i, r in enumerate(self._replicas) if r.state is _State.READY and r.process}
            if name in self._loading:
                return failed(AdapterError(f"LoRA adapter {name!r} is already being loaded"))
            if not serving:
                return failed(EngineError(f"no replica of this worker is serving: {self._problem() or 'starting'}"))
            load = self._loading[name] = PendingLoad(name, path, set(serving))
        for process in serving.values():
            if process is not None:
                process.send(LoadAdapter(name, str(path), max_rank))
        return load.future

    def unload_adapter(self, name: str) -> None:
        """On every replica, each once its last sequence naming it ends; restarts no longer load it."""
        with self._changed:
            self._set_spec_adapter(name, None)
            processes = [r.process for r in self._replicas if r.process is not None]
        for process in processes:
            process.send(UnloadAdapter(name))

    def take(self, request_ids: Iterable[str]) -> dict[str, Update]:
        return self._outboxes.take(request_ids)

    def wait(self, request_ids: Iterable[str], after_step: int, timeout_s: float) -> None:
        self._outboxes.wait(request_ids, lambda: self.steps > after_step or self._failed is not None, timeout_s)

    def take_records(self) -> list[StepRecord]:
        with self._changed:
            records, self._records = self._records, []
        return records

    def step_running_for(self) -> float:
        """0: each replica's steps are policed here, by replica (see `_supervise`)."""
        return 0.0

    @property
    def slots(self) -> int:
        per_replica = 0 if self.facts is None else self.facts.n_slots
        return per_replica * sum(r.state is _State.READY for r in self._replicas)

    @property
    def free_slots(self) -> int:
        per_replica = 0 if self.facts is None else self.facts.n_slots
        ready = [r for r in self._replicas if r.state is _State.READY]
        return sum(max(0, per_replica - r.occupied - r.waiting) for r in ready)

    @property
    def occupied(self) -> int:
        return sum(r.occupied for r in self._replicas if r.state is _State.READY)

    @property
    def waiting(self) -> int:
        return sum(r.waiting for r in self._replicas if r.state is _State.READY)

    def health(self) -> Health:
        with self._changed:
            return Health(
                len(self._replicas),
                sum(r.state is _State.READY for r in self._replicas),
                tuple(r.occupied if r.state is _State.READY else None for r in self._replicas),
                self._problem(),
                self._failed,
            )

    def replica_of(self, request_id: str) -> int | None:
        """The replica generating this request (tests and logs)."""
        with self._changed:
            return self._owner.get(request_id)

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            processes = [r.process for r in self._replicas if r.process is not None]
            self._changed.notify_all()
        if self._supervisor is not None:
            self._supervisor.join(timeout=5)
        stoppers = [threading.Thread(target=p.stop, args=(STOP_TIMEOUT_S,), daemon=True) for p in processes]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(STOP_TIMEOUT_S + 5)

    # -- what the replicas say (their reader threads) ----------------------------------------
    def _on_message(self, process: ReplicaProcess, message: object) -> None:
        index = process.spec.index
        replica = self._replicas[index]
        if isinstance(message, Stepped):
            self._apply(replica, index, message)
            return
        if isinstance(message, Ready):
            with self._changed:
                if replica.process is not process:
                    return
                self.facts = self.facts or message.facts
                replica.state, replica.failed_starts, replica.heard_at = _State.READY, 0, self._clock()
                self._changed.notify_all()
            logger.info("replica %d (pid %d) is serving (loaded in %.1f s)", index, message.pid, message.load_s)
            replica.changed.set()
            self._report_health()
        elif isinstance(message, StartFailed):
            with self._changed:
                replica.cause = message.cause
        elif isinstance(message, AdapterLoaded):
            with self._changed:
                load = self._loading.get(message.name)
                done = load is not None and load.answered(index, message.error)
            if load is not None and done:
                self._settle_load(load)
        else:
            logger.error("replica %d sent an unknown message: %r", index, message)

    def _apply(self, replica: _Replica, index: int, message: Stepped) -> None:
        idle = False
        with self._changed:
            for progress in message.progress:
                box = self._outboxes.get(progress.request_id)
                if box is None or box.ended or self._owner.get(progress.request_id) != index:
                    continue  # cancelled or failed here meanwhile
                text = box.sequence.adopt(progress)
                if text:
                    box.pending.append(text)
                if box.sequence.finished:
                    box.ended = True
                    self._forget(progress.request_id)
            replica.occupied, replica.waiting, replica.heard_at = message.occupied, message.waiting, self._clock()
            self._records.extend(message.records)
            del self._records[:-1000]  # nobody drains them outside TorchServe
            self.steps += 1
            idle = not self._owner
            self._changed.notify_all()
        if idle and self.on_idle is not None:
            try:
                self.on_idle()
            except Exception:
                logger.exception("on_idle failed")

    def _on_exit(self, process: ReplicaProcess, how: str) -> None:
        index = process.spec.index
        replica = self._replicas[index]
        with self._changed:
            if replica.process is not process:
                return
            started = replica.state is _State.STARTING
            replica.process, replica.state = None, _State.DOWN
            replica.occupied = replica.waiting = 0
            if started:
                replica.failed_starts += 1
            replica.cause = f"replica {index} (pid {process.pid}) {how}" + (
                f" while starting: {replica.cause}" if started and replica.cause else ""
            )
            backoff = RESTART_BACKOFF_S[min(replica.failed_starts, len(RESTART_BACKOFF_S) - 1)]
            replica.restart_at = self._clock() + backoff
            error = EngineError(f"{replica.cause} while generating this response; retry it")
            lost = sorted(replica.requests)
            for request_id in lost:
                box = self._outboxes.get(request_id)
                if box is not None and not box.ended:
                    box.sequence.fail(error)
                    box.ended = True
                self._owner.pop(request_id, None)
            replica.requests.clear()
            stopping = self._stopping
            settled = [load for load in self._loading.values() if load.gone(index)]
            self._changed.notify_all()
        for load in settled:
            self._settle_load(load)
        replica.changed.set()
        if stopping:
            return
        logger.error(
            "%s; %d request(s) of it ended with an error; restarting it in %.1f s", replica.cause, len(lost), backoff
        )
        self._report_health()

    # -- supervision ------------------------------------------------------------------------
    def _supervise(self) -> None:
        while True:
            with self._changed:
                self._changed.wait(SUPERVISE_EVERY_S)
                if self._stopping or self._failed is not None:
                    return
                now = self._clock()
                due = [k for k, r in enumerate(self._replicas) if r.state is _State.DOWN and now >= r.restart_at]
                hung = [
                    r
                    for r in self._replicas
                    if r.state is _State.READY and r.requests and now - r.heard_at > self._step_timeout_s
                ]
                given_up = next((r for r in self._replicas if r.failed_starts >= MAX_FAILED_STARTS), None)
                if given_up is not None:
                    self._failed = f"{given_up.cause} ({given_up.failed_starts} failed starts in a row)"
                    self._changed.notify_all()
            if given_up is not None:
                logger.error("giving up on the replicas: %s", self._failed)
                self._report_health()
                return
            for replica in hung:
                logger.error(
                    "replica %d has not finished a step in %.0f s (step_timeout_s); killing it",
                    replica.spec.index,
                    self._step_timeout_s,
                )
                if replica.process is not None:
                    replica.process.kill()
            for index in due:
                try:
                    self._launch(index)
                except Exception as exc:  # could not even spawn it: count it as a failed start
                    with self._changed:
                        replica = self._replicas[index]
                        replica.state, replica.failed_starts = _State.DOWN, replica.failed_starts + 1
                        replica.cause = f"replica {index} could not be started: {exc}"
                        replica.restart_at = self._clock() + RESTART_BACKOFF_S[-1]
                self._report_health()

    def _settle_load(self, load: PendingLoad) -> None:
        """Every replica answered a run-time load: keep it everywhere, or nowhere."""
        with self._changed:
            self._loading.pop(load.name, None)
            ok = not load.errors and bool(load.loaded)
            if ok:
                self._set_spec_adapter(load.name, str(load.path))
            undo = [] if ok else [self._replicas[i].process for i in sorted(load.loaded)]
        for process in undo:
            if process is not None:
                process.send(UnloadAdapter(load.name))
        load.settle()

    # -- helpers (the lock held) ----------------------------------------------------------------
    def _set_spec_adapter(self, name: str, path: str | None) -> None:
        """What every replica's next start serves: with the adapter at `path`, or (None) without it."""
        for replica in self._replicas:
            config = replica.spec.config
            adapters = dict(config.handler.lora.adapters) if config.handler.lora is not None else {}
            if path is None:
                adapters.pop(name, None)
            else:
                adapters[name] = path
            replica.spec = replace(replica.spec, config=config.with_adapters(adapters))

    def _forget(self, request_id: str) -> ReplicaProcess | None:
        index = self._owner.pop(request_id, None)
        if index is None:
            return None
        replica = self._replicas[index]
        replica.requests.discard(request_id)
        return replica.process

    def _problem(self) -> str | None:
        down = [r for r in self._replicas if r.state is not _State.READY]
        if not down:
            return None
        described = "; ".join(r.cause or f"replica {r.spec.index} is {r.state.value}" for r in down)
        return f"{len(self._replicas) - len(down)} of {len(self._replicas)} replicas serving ({described})"

    def _report_health(self) -> None:
        if self.on_health is None:
            return
        try:
            self.on_health()
        except Exception:
            logger.exception("reporting the replicas' health failed")
