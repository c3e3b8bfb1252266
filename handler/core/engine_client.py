"""The one way a frontend talks to the engine: submit a prepared request, wait for news, take
it, release the request; built once per model (`EngineClient.build`: the one `StepEngine` of a
worker, or the `ReplicaSet` of its replicas), the same for TorchServe's adapter and the ASGI
frontend.

What it decides so that no frontend has to:
- a request whose constraint still compiles (handler/grammar/compiler.py) is held here and
  handed to the engine the moment its compile ends; one refused (or past its budget) gets its
  400 as news, like any failure;
- the step watchdog: a step running longer than `handler.step_timeout_s` (a hung device call)
  fails every request in flight with a 500 (an in-band error once its stream is open) instead of
  hanging its clients; the engine drops their sequences when the step returns;
- bounded waits: a request that has no first token `handler.max_queue_wait_s` after it reached
  the engine (it waits for a slot) is taken out and answered a 503 with Retry-After (`Overloaded`);
- a replica that gave up starting fails everything in flight and every later request
  (`failure`), and the frontend is told (`on_health`);
- a request submitted with `confirm_client` (a frontend that learns its client left only by
  writing to it: TorchServe's) waits here, not in the engine, until a slot is free for it; then
  its news says `ask_client`, the frontend opens its response, and it reaches the engine when the
  frontend `confirm`s that its client is still there. A client that left costs no prefill.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from handler.core.adapter_updates import AdapterUpdates
from handler.core.preparation import GenerationCore, Work
from handler.core.response import News
from handler.engine.interface import Engine
from handler.engine.outbox import Update
from handler.engine.speculation import Speculator
from handler.engine.step_engine import StepEngine, StepRecord
from handler.errors import EngineError, Overloaded, ServingError
from handler.replicas.model import ReplicatedModel
from handler.replicas.replica_set import Health, ReplicaSet

logger = logging.getLogger(__name__)

# How often a wait looks whether a held request's compile ran past its budget (a compile that
# ends hands its request over at once, from the compile thread).
HELD_POLL_S = 0.02


class _Gate(enum.Enum):
    """A `confirm_client` request's way to the engine."""

    WAITING = "waiting"  # for a free slot
    ASKED = "asked"  # a slot is free: its frontend is asked whether its client is still there
    TOLD = "told"  # the ask went out as news; the frontend's `confirm` hands it to the engine


@dataclass
class _InFlight:
    work: Work
    open: set[str]  # its sequences not ended yet
    compiling: bool  # its constraint is compiling
    gate: _Gate | None = None  # None: it goes to the engine as soon as it compiled
    failure: ServingError | None = None  # to report at the next take
    updates: list[Update] = field(default_factory=list)  # taken from the engine, not yet from us
    since: float = 0.0  # when it was submitted, then when it reached the engine (time.monotonic)

    @property
    def held(self) -> bool:
        """Not in the engine (yet)."""
        return self.compiling or self.gate is not None


class EngineClient:
    def __init__(
        self,
        core: GenerationCore,
        engine: Engine,
        step_timeout_s: float,
        replicas: ReplicaSet | None = None,
        max_queue_wait_s: float | None = None,
    ) -> None:
        self.core = core
        self.engine = engine
        self.replicas = replicas
        self.step_timeout_s = step_timeout_s
        self.max_queue_wait_s = max_queue_wait_s  # None: a request waits for a slot as long as it takes
        self.failure: str | None = None  # the replicas gave up: every request fails with it
        self.on_health: Callable[[Health], None] | None = None  # replicas went down, came back or gave up
        self._lock = threading.Lock()
        self._requests: dict[str, _InFlight] = {}
        self._of_sequence: dict[str, str] = {}  # sequence id -> request id
        if replicas is not None:
            replicas.on_health = self._replica_health

    @classmethod
    def build(cls, core: GenerationCore) -> EngineClient:
        """The model's engine: its replicas (`scheduler.replicas` > 1, each stepping on its own),
        or one `StepEngine` over the backend. Not started: see `start`."""
        settings, handler = core.config.scheduler, core.config.handler
        backend = core.backend
        if isinstance(backend, ReplicatedModel):
            client = cls(core, backend.replicas, handler.step_timeout_s, backend.replicas, handler.max_queue_wait_s)
        else:
            engine = StepEngine(
                backend,
                settings.prefill_token_budget,
                admission_wait=settings.admission_wait,
                max_adapters=core.config.max_adapters,
                speculator=Speculator.of(settings.speculation),
            )
            client = cls(core, engine, handler.step_timeout_s, max_queue_wait_s=handler.max_queue_wait_s)
        if handler.lora is not None and handler.lora.runtime_updates:
            core.adapter_updates = AdapterUpdates(
                core,
                client.engine,
                core.backend.runtime_adapter_refusal,
                handler.lora.max_lora_rank,
                core.model_dir,
                handler.step_timeout_s,
            )
        return client

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def inline(self) -> StepEngine | None:
        """The StepEngine a caller steps itself (`scheduler.overlap: false`); None with replicas."""
        return self.engine if isinstance(self.engine, StepEngine) else None

    def start(self) -> None:
        """Step on the engine's own thread (replicas always do)."""
        self.engine.start()

    def stop(self) -> None:
        self.engine.stop()

    # -- requests ----------------------------------------------------------------------------
    def submit(self, work: Work, confirm_client: bool = False) -> None:
        """Hand a prepared request over (one answered without the engine is not for here). One whose
        constraint still compiles is held until it compiled; a failed model refuses it as news.
        `confirm_client`: it waits for a free slot here and goes on only when `confirm`ed."""
        with self._lock:
            entry = self._requests[work.request_id] = _InFlight(
                work,
                {s.request_id for s in work.sequences},
                compiling=work.compiling is not None,
                gate=_Gate.WAITING if confirm_client else None,
                since=time.monotonic(),
            )
            for sequence in work.sequences:
                self._of_sequence[sequence.request_id] = work.request_id
            if self.failure is not None:
                entry.failure = EngineError(self.failure)
                return
        if entry.compiling:
            assert work.compiling is not None
            work.compiling.future.add_done_callback(lambda _: self._settle(work.request_id))
            self._settle(work.request_id)  # it may have compiled already
        elif entry.gate is not None:
            self._ask_for_free_slots()
        else:
            self._to_engine(work)

    def confirm(self, request_id: str) -> None:
        """Its client is still there (its frontend was asked): on to the engine."""
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is None or entry.gate is not _Gate.TOLD or entry.failure is not None:
                return
            entry.gate = None
        self._to_engine(entry.work)

    @property
    def confirming(self) -> bool:
        """A request was asked about its client and not confirmed yet (the engine may hold its next
        step for it: see `admissions_done`)."""
        with self._lock:
            return any(e.gate in (_Gate.ASKED, _Gate.TOLD) for e in self._requests.values())

    def release(self, request_id: str) -> bool:
        """The request is over for its frontend (answered, failed, or its client left): abort what
        is left of it in the engine. Whether some of it was still generating (a cancellation)."""
        with self._lock:
            entry = self._forget(request_id)
            if entry is None:
                return False
            still_open = [] if entry.held else list(entry.open)
        for sequence_id in still_open:
            self.engine.abort(sequence_id)
        if still_open:
            self._ask_for_free_slots()  # its slot is free at the next step: a gated request may have it
        return bool(entry.open) and entry.failure is None

    def admissions_done(self) -> None:
        self.engine.admissions_done()

    def fail_all(self, error: ServingError) -> None:
        """End every request with `error` (a drain deadline): those in the engine at its next step,
        the held ones now."""
        self.engine.fail_all(error)
        with self._lock:
            for entry in self._requests.values():
                if entry.held and entry.failure is None:
                    entry.failure = error

    # -- news ----------------------------------------------------------------------------------
    @property
    def steps(self) -> int:
        return self.engine.steps

    def wait(self, request_ids: Iterable[str], after_step: int, timeout_s: float) -> None:
        """Until one of these requests has news, a step after `after_step` ended, or the timeout
        (shortened while a request is held, and to the step watchdog's limit)."""
        ids = list(request_ids)
        with self._lock:
            entries = [e for e in (self._requests.get(i) for i in ids) if e is not None]
            if any(e.failure is not None or e.updates for e in entries):
                return
            if any(e.gate is _Gate.ASKED for e in entries):
                return
            held = any(e.compiling for e in entries)
            sequence_ids = [s for e in entries if not e.held for s in e.open]
        cap = min(timeout_s, self.step_timeout_s, HELD_POLL_S if held else timeout_s)
        self.engine.wait(sequence_ids, after_step, cap)

    def take(self, request_ids: Iterable[str]) -> dict[str, News]:
        """What each of these requests got since the last take; a request whose last news this is
        is forgotten (as `release` does)."""
        ids = list(request_ids)
        self._check_held(ids)
        self._watchdog()
        self._expire_waits()
        self._ask_for_free_slots()
        with self._lock:
            sequence_ids = [s for i in ids if (e := self._requests.get(i)) is not None and not e.held for s in e.open]
        updates = self.engine.take(sequence_ids)
        news: dict[str, News] = {}
        with self._lock:
            for sequence_id, update in updates.items():
                entry = self._requests.get(self._of_sequence.get(sequence_id, ""))
                if entry is None:
                    continue
                entry.updates.append(update)
                if update.ended:
                    entry.open.discard(sequence_id)
            for request_id in ids:
                entry = self._requests.get(request_id)
                if entry is None:
                    continue
                ask = entry.gate is _Gate.ASKED and entry.failure is None
                if not (entry.updates or entry.failure or ask):
                    continue
                if ask:
                    entry.gate = _Gate.TOLD
                news[request_id] = News(entry.updates, entry.failure, ask_client=ask)
                entry.updates = []
                if entry.failure is not None or not entry.open:
                    self._forget(request_id)
        return news

    @property
    def in_flight(self) -> int:
        """Sequences submitted and not ended (held, waiting for a slot, or generating)."""
        with self._lock:
            return sum(len(e.open) for e in self._requests.values())

    def knows(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._requests

    # -- the engine's figures ----------------------------------------------------------------
    @property
    def occupied(self) -> int:
        return self.engine.occupied

    @property
    def waiting(self) -> int:
        """Sequences waiting for a slot: in the engine's queue or at the client gate."""
        with self._lock:
            gated = sum(len(e.open) for e in self._requests.values() if e.gate is not None)
        return self.engine.waiting + gated

    def take_records(self) -> list[StepRecord]:
        return self.engine.take_records()

    # -- inside ------------------------------------------------------------------------------
    def _to_engine(self, work: Work) -> None:
        with self._lock:
            entry = self._requests.get(work.request_id)
            if entry is not None:
                entry.since = time.monotonic()
        for sequence in work.sequences:
            self.engine.submit(sequence)
        self.engine.admissions_done()  # a step held for a newcomer may start: here it is

    def _settle(self, request_id: str) -> None:
        """A held request's compile ended (or may have): hand it to the engine, or fail it."""
        with self._lock:
            entry = self._requests.get(request_id)
            if entry is None or not entry.compiling or not self.core.settle(entry.work):
                return
            entry.compiling = False
            work = entry.work
            if work.error is not None:
                entry.failure = work.error
                entry.open.clear()
                return
            if entry.failure is not None:  # failed while it compiled (drain, watchdog)
                return
            gated = entry.gate is not None
            if gated:
                entry.since = time.monotonic()  # its wait for a slot starts now, as in the engine
        if gated:
            self._ask_for_free_slots()
            return
        self._to_engine(work)
        with self._lock:  # released meanwhile (from the frontend's thread): its abort found nothing yet
            released = self._requests.get(request_id) is not entry
        if released:
            for sequence in work.sequences:
                self.engine.abort(sequence.request_id)

    def _check_held(self, request_ids: list[str]) -> None:
        """Held requests whose compile ran past its budget get their 400 (`settle` says so)."""
        with self._lock:
            held = [i for i in request_ids if (e := self._requests.get(i)) is not None and e.compiling]
        for request_id in held:
            self._settle(request_id)

    def _watchdog(self) -> None:
        stuck = self.engine.step_running_for()
        if stuck <= self.step_timeout_s:
            return
        error = EngineError(f"the model did not finish a step within {stuck:.0f} s")
        aborts = []
        with self._lock:
            failing = [e for e in self._requests.values() if e.failure is None and not e.held]
            for entry in failing:
                entry.failure = error
                aborts += entry.open
                entry.open = set()
        if failing:
            logger.error(
                "a model step has been running for %.0f s (step_timeout_s %.0f): %d request(s) failed",
                stuck,
                self.step_timeout_s,
                len(failing),
            )
        for sequence_id in aborts:
            self.engine.abort(sequence_id)

    def _ask_for_free_slots(self) -> None:
        """Gated requests, first come first asked, as far as the free slots go (those asked and not
        confirmed yet count as taken)."""
        with self._lock:
            gated = [e for e in self._requests.values() if e.gate is not None and e.failure is None]
            if not any(e.gate is _Gate.WAITING and not e.compiling for e in gated):
                return
            slots = self.engine.slots
            free = self.engine.free_slots - sum(len(e.open) for e in gated if e.gate is not _Gate.WAITING)
            for entry in gated:
                if entry.gate is not _Gate.WAITING or entry.compiling:
                    continue
                needed = min(len(entry.open), slots) or 1
                if needed > free:
                    return  # first come, first served: no one overtakes it
                entry.gate = _Gate.ASKED
                free -= needed

    def _expire_waits(self) -> None:
        """Requests that waited `max_queue_wait_s` for a slot without a first token get their 503
        (a gated one only while its response is not open: asked, it gets a slot at once)."""
        limit = self.max_queue_wait_s
        if limit is None:
            return
        now, aborts = time.monotonic(), []
        with self._lock:
            for entry in self._requests.values():
                waiting = entry.gate is _Gate.WAITING or not entry.held
                if not waiting or entry.compiling or entry.failure is not None or now - entry.since <= limit:
                    continue
                if any(s.first_token_at is not None for s in entry.work.sequences):
                    continue
                entry.failure = Overloaded(
                    f"no slot was free within handler.max_queue_wait_s ({limit:g} s): the server is busy; retry "
                    "shortly",
                    "queue_wait",
                )
                if not entry.held:
                    aborts += entry.open
                entry.open = set()
        for sequence_id in aborts:
            self.engine.abort(sequence_id)

    def _forget(self, request_id: str) -> _InFlight | None:
        """Under the lock: drop the request and its sequences' ids; the entry it had."""
        entry = self._requests.pop(request_id, None)
        if entry is not None:
            for sequence in entry.work.sequences:
                self._of_sequence.pop(sequence.request_id, None)
        return entry

    def _replica_health(self) -> None:
        """From the replica set's threads: a replica went down, came back or gave up. One that gave
        up fails the model: what is in flight ends, every later request is refused."""
        assert self.replicas is not None
        health = self.replicas.health()
        if health.failed is not None and self.failure is None:
            self.failure = f"the model's replicas failed: {health.failed}"
            self.fail_all(EngineError(self.failure))
        if self.on_health is not None:
            self.on_health(health)
