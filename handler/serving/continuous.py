"""`scheduler.mode: continuous`: TorchServe's continuousBatching protocol onto the core.

With `continuousBatching: true` the frontend calls `handle()` again and again with every
request still in flight (re-sent with an empty body, on 0.11 without headers) plus new
arrivals; each call's reply for a request becomes one HTTP chunk, and the request stays in
flight while its stopping criterion says "not yet". So one call here:

1. requests we know that are missing from the call are gone (the client closed): released;
   new ones are prepared and handed to the engine client (handler/core/engine_client.py), or
   answered at once (a 4xx, a model listing);
   the frontend notices a closed client only when it writes to it (RestJob.isOpen, checked after
   a reply with ts_stream_next "true"), so an HTTP request waits in the engine client until a slot
   is free, then its response opens (200, its headers, no body) and it goes to the engine only if
   the next call still carries it; from then on every call gives it a reply, empty when there is
   nothing to say, so a client that leaves is noticed within a step. The price: a failure after
   that point is the route's error body under the 200 (as in a stream), also for a non-streamed
   request;
2. wait until some request of the call has news, or the engine finished a step (so new
   arrivals join within a step); the engine keeps stepping meanwhile;
3. each request's news goes through its `ResponseMachine` (handler/core/response.py), which
   says what to send; a request with nothing to send is left out of the reply (removed from
   `context.request_ids`), so the frontend keeps it in flight with its status line unwritten.

What is TorchServe's alone stays in handler/serving/: per-call indexes, the stopping criteria,
gRPC's one reply and the 0.11 rules (handler/serving/jobs.py).

Nothing escapes `handle()`: an exception there would answer 503 to every request in flight.
Draining (handler/serving/drain.py): new requests get a 503; at the deadline the engine fails
what is left. Replicas: their health goes to the /ping plugin (`replicas-<pid>.json`), and a
replica that gave up starting fails the worker (handler/serving/init_failure.py).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from handler.api.native import NativeApi
from handler.core.engine_client import EngineClient
from handler.core.preparation import Work
from handler.core.response import Output, ResponseMachine
from handler.errors import EngineError, ServingError
from handler.replicas.replica_set import Health, ReplicaStartError
from handler.serving import drain
from handler.serving.init_failure import FailedServing
from handler.serving.jobs import Jobs, Reply, Tracked, merge
from handler.serving.replies import set_content_type
from handler.serving.service import GenerationService
from handler.serving.state import clear_replica_health, state_dir, write_replica_health

logger = logging.getLogger(__name__)

WAIT_CAP_S = 1.0  # longest a call waits for news; the engine answers each step well within it
# The frontend calls again at once while it holds a job of ours; this long without a call means it
# holds none, whatever is left in `_tracked` (a client that went away unnoticed).
IDLE_GAP_S = 2 * WAIT_CAP_S
# After this long without a call, what we still track is gone for sure (its clients left with nothing
# else in flight, so no call came to say so): forgotten, so its slots and gauges are free.
ORPHANED_AFTER_S = 10 * WAIT_CAP_S


class ContinuousServing:
    def __init__(self, service: GenerationService) -> None:
        self.service = service
        self.client = EngineClient.build(service)
        self.engine = self.client.engine
        self.replicas = self.client.replicas
        self.overlap = service.config.scheduler.overlap or self.replicas is not None
        self._failed: FailedServing | None = None  # a replica gave up starting: the worker fails
        self._health_lock = threading.Lock()
        self.jobs = Jobs()
        self._returned_at: float | None = None  # when the last handle() returned (round trip)
        self._in_call = False
        self._left_call_at = 0.0  # perf_counter when the last handle() returned, whatever happened
        self._context: Any = None  # the frontend's context: one object for the worker's life
        self.metrics = service.token_metrics
        self.engine.on_idle = self._report_engine
        self.client.on_health = self._show_health
        if self.overlap:
            self.client.start()
        self.drain = drain.DrainWatcher.from_env(self.busy)
        self.drain.start()
        self._call_lock = threading.Lock()  # a call, or forgetting orphans between calls
        self._stopping = threading.Event()
        self._orphan_sweeper = threading.Thread(target=self._sweep_orphans, name="orphan-sweeper", daemon=True)
        self._orphan_sweeper.start()

    def handle(self, data: list[Any], context: Any) -> list[str]:
        if self._failed is not None and not self.jobs.tracked:
            return self._failed.handle(data, context)
        replies = [""] * len(data)
        with self._call_lock:
            self._in_call = True
            try:
                self._handle(data, context, replies)
            except Exception as exc:  # a bug; answer everyone in this call with a 500 instead of a 503 for all
                logger.exception("continuous handle() failed")
                self._fail_all(context, replies, EngineError(f"internal error: {exc}"))
            finally:
                self._left_call_at = time.perf_counter()
                self._in_call = False
        return replies

    def busy(self) -> bool:
        """Whether a request of this worker is still in flight (the drain watcher's question)."""
        if self._in_call:
            return True
        if not self.jobs:
            return False
        return time.perf_counter() - self._left_call_at < IDLE_GAP_S

    def _handle(self, data: list[Any], context: Any, replies: list[str]) -> None:
        entered = time.perf_counter()
        self._context = context
        self.metrics.bind(context)
        if self._returned_at is not None:
            self.metrics.serving.round_trip(entered - self._returned_at)
        ids: dict[int, str] = dict(context.request_ids)
        present = set(ids.values())
        for request_id in [r for r in [*self.jobs.tracked, *self.jobs.answered] if r not in present]:
            self._cancel(request_id)
        if self.drain.expired:
            self.client.fail_all(drain.cut())
        self._confirm_clients(ids)
        step_before = self.client.steps
        for index, request_id in ids.items():
            if request_id not in self.jobs:
                self._admit(index, request_id, data[index], context)
        if not self.client.confirming:  # else the step held for arrivals waits for the confirmation
            self.client.admissions_done()  # a step held for this call's arrivals may start
        live = [r for r in ids.values() if r in self.jobs.tracked]
        if not self.overlap:
            assert self.client.inline is not None
            self.client.inline.step()
        elif not any(r in self.jobs.answered or self._answerable(self.jobs.tracked[r]) for r in ids.values()):
            self.client.wait(live, step_before, self._wait_cap())
        news = self.client.take(live)
        planned: dict[int, Reply] = {}
        for index, request_id in ids.items():
            if request_id in self.jobs.answered:  # 0.11 kept a job we answered in full: end it
                planned[index] = Reply("", end=True)
                continue
            tracked = self.jobs.tracked[request_id]
            output, tracked.due = tracked.due, None
            if output is None and request_id in news:
                tracked.asked = tracked.asked or news[request_id].ask_client
                output = tracked.machine.feed(news[request_id])
                if tracked.machine.done:  # n > 1: a choice that failed ends its siblings too
                    self.client.release(request_id)
            reply = merge(tracked, self._reply(tracked, output, index, context))
            if reply is None and tracked.machine.opened and not tracked.machine.done:
                reply = Reply("", end=False)  # the frontend looks at its client's socket after each reply
            if reply is not None:
                planned[index] = reply
        self.jobs.send(context, ids, planned, replies)
        self._report_engine()
        self._returned_at = time.perf_counter()

    def _sweep_orphans(self) -> None:
        """The frontend calls again at once while it holds a job of ours; with none, no call comes to
        say the last ones' clients left. So what is tracked after `ORPHANED_AFTER_S` without a call
        is released (a non-streamed request nobody waits for would otherwise run to its end)."""
        while not self._stopping.wait(WAIT_CAP_S):
            with self._call_lock:
                if not self.jobs or time.perf_counter() - self._left_call_at < ORPHANED_AFTER_S:
                    continue
                orphans = [*self.jobs.tracked, *self.jobs.answered]
                for request_id in orphans:
                    self._cancel(request_id)
                logger.info(
                    "%d request(s) forgotten: no call for %.0f s, their clients left", len(orphans), ORPHANED_AFTER_S
                )
                self._report_engine()

    def _wait_cap(self) -> float:
        """How long a call may wait for news: wake at the drain deadline to end what is left."""
        left = self.drain.seconds_left()
        return WAIT_CAP_S if left is None or left <= 0 else min(WAIT_CAP_S, left)

    def _admit(self, index: int, request_id: str, row: Any, context: Any) -> None:
        refusal = drain.refused() if self.drain.draining else None
        if self._failed is not None:
            refusal = self._failed.error
        work = self.service.prepare(index, row, context, refusal)
        tracked = self.jobs.tracked[request_id] = Tracked(ResponseMachine(work, self.metrics.serving), work.grpc)
        tracked.due = tracked.machine.immediate()
        if tracked.due is None:
            self.client.submit(work, confirm_client=not work.grpc)  # gRPC: one reply, no socket to look at

    def _confirm_clients(self, ids: dict[int, str]) -> None:
        """Requests whose opened response went out and that this call still carries: their clients
        are there, on to the engine. (One whose reply a 0.11 errors-only call held back waits.)"""
        for request_id in ids.values():
            tracked = self.jobs.tracked.get(request_id)
            if tracked is not None and tracked.asked and tracked.stash is None:
                tracked.asked = False
                self.client.confirm(request_id)

    def _cancel(self, request_id: str) -> None:
        if self.jobs.answered.end(request_id):
            return
        tracked = self.jobs.tracked.pop(request_id)
        if self.client.release(request_id) and not tracked.closing:
            self.metrics.serving.cancelled()

    @staticmethod
    def _answerable(tracked: Tracked) -> bool:
        """Has a reply without waiting for the engine."""
        return tracked.closing or tracked.stash is not None or tracked.due is not None

    @staticmethod
    def _reply(tracked: Tracked, output: Output | None, index: int, context: Any) -> Reply | None:
        if tracked.closing:
            return Reply("", end=True)
        if output is None:
            return None
        if output.error is not None:
            status, phrase = tracked.machine.api.http_status(output.error)
            context.set_response_status(status, phrase, index)
        set_content_type(context, index, output.content_type)
        for name, value in output.headers:
            context.set_response_header(index, name, value)
        return Reply(output.body, end=output.end, plain_error=output.whole and output.failed)

    def _fail_all(self, context: Any, replies: list[str], error: ServingError) -> None:
        """A bug in a call: answer everyone in it with `error`, in the form each one's state allows."""
        try:
            ids: dict[int, str] = dict(context.request_ids)
            planned: dict[int, Reply] = {}
            for index, request_id in ids.items():
                tracked = self.jobs.tracked.get(request_id)
                if request_id in self.jobs.answered or (tracked is not None and tracked.closing):
                    planned[index] = Reply("", end=True)
                    continue
                if tracked is None:
                    work = Work(request_id, NativeApi())
                    tracked = self.jobs.tracked[request_id] = Tracked(ResponseMachine(work), grpc=False)
                tracked.stash = None
                self.client.release(request_id)
                output = tracked.due or (None if tracked.machine.done else tracked.machine.fail(error))
                planned[index] = self._reply(tracked, output, index, context) or Reply("", end=True)
            self.jobs.send(context, ids, planned, replies)
        except Exception:
            logger.exception("could not answer the call after a failure")

    def _report_engine(self) -> None:
        """The engine's step records and gauges (also when it went idle: a cancelled request with
        nothing else in flight gets no further call, so the last call's gauges would stay up)."""
        self.metrics.serving.engine_steps(self.client.take_records(), self.client.occupied, self.client.waiting)
        if self.replicas is not None:
            self.metrics.serving.replicas(self.replicas.health())

    def _show_health(self, health: Health) -> None:
        """A replica went down, came back or gave up (from the replica set's threads, which may
        report at once: the last write under the lock is the latest)."""
        with self._health_lock:
            directory = state_dir()
            try:
                if directory is not None and health.problem is None:
                    clear_replica_health(directory)
                elif directory is not None:
                    write_replica_health(directory, "Degraded" if health.ready else "Unhealthy", health.problem or "")
            except OSError:
                logger.exception("could not write the replicas' health into %s", directory)
            if health.failed is not None and self._failed is None:
                self._failed = FailedServing.start(ReplicaStartError(health.failed), self._context)

    def shutdown(self) -> None:
        self._stopping.set()
        self.drain.stop()
        self.client.stop()
        if self._failed is not None:
            self._failed.shutdown()
        directory = state_dir()
        if self.replicas is not None and directory is not None:
            clear_replica_health(directory)
