"""`scheduler.mode: continuous`: TorchServe's continuousBatching protocol onto the core.

With `continuousBatching: true` the frontend calls `handle()` again and again with every
request still in flight (re-sent with an empty body, on 0.11 without headers) plus new
arrivals; each call's reply for a request becomes one HTTP chunk, and the request stays in
flight while its stopping criterion says "not yet". So one call here:

1. requests we know that are missing from the call are gone (the client closed): released;
   new ones are prepared and handed to the engine client (handler/core/engine_client.py), or
   answered at once (a 4xx, a model listing);
2. wait until some request of the call has news, or the engine finished a step (so new
   arrivals join within a step); the engine keeps stepping meanwhile;
3. each request's news goes through its `ResponseMachine` (handler/core/response.py), which
   says what to send; a request with nothing to send is left out of the reply (removed from
   `context.request_ids`), so the frontend keeps it in flight with its status line unwritten.

What is TorchServe's alone stays here: per-call indexes, the stopping criteria, gRPC's one
reply, and the 0.11 rules. On 0.12 a request answered in one reply gets no `ts_stream_next`
header (a criterion returning None): one plain response. 0.11 turns None into "continue", so
there such a reply opens a stream and the next call closes it with an empty last chunk; and
0.11 sends a 4xx/5xx only as a plain response (below, `_errors_only`).

Nothing escapes `handle()`: an exception there would answer 503 to every request in flight.
Draining (handler/serving/drain.py): new requests get a 503; at the deadline the engine fails
what is left. Replicas: their health goes to the /ping plugin (`replicas-<pid>.json`), and a
replica that gave up starting fails the worker (handler/serving/init_failure.py).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from handler.api.native import NativeApi
from handler.core.engine_client import EngineClient
from handler.core.preparation import Work
from handler.core.response import Output, ResponseMachine
from handler.errors import EngineError, ServingError
from handler.replicas.replica_set import Health, ReplicaStartError
from handler.serving import drain
from handler.serving.grpc_jobs import end_grpc_reply
from handler.serving.init_failure import FailedServing
from handler.serving.replies import AnsweredInFull, set_content_type
from handler.serving.service import GenerationService
from handler.serving.state import clear_replica_health, state_dir, write_replica_health
from handler.serving.ts_compat import ONE_SHOT_REPLIES

logger = logging.getLogger(__name__)

WAIT_CAP_S = 1.0  # longest a call waits for news; the engine answers each step well within it
# The frontend calls again at once while it holds a job of ours; this long without a call means it
# holds none, whatever is left in `_tracked` (a client that went away unnoticed).
IDLE_GAP_S = 2 * WAIT_CAP_S


@dataclass
class _Tracked:
    machine: ResponseMachine
    grpc: bool
    due: Output | None = None  # decided without the engine (a reply, an error while preparing)
    opened: bool = False  # a reply with ts_stream_next went out: status and headers are on the wire
    closing: bool = False  # 0.11: the whole answer went out; the next call ends the stream
    stash: _Reply | None = None  # 0.11: a reply held back while a call carried only error responses


@dataclass
class _Reply:
    body: str
    end: bool  # the last reply for this request
    plain_error: bool = False  # a 4xx/5xx before anything was sent: must be one plain response


class ContinuousServing:
    def __init__(self, service: GenerationService) -> None:
        self.service = service
        self.client = EngineClient.build(service)
        self.engine = self.client.engine
        self.replicas = self.client.replicas
        self.overlap = service.config.scheduler.overlap or self.replicas is not None
        self._failed: FailedServing | None = None  # a replica gave up starting: the worker fails
        self._health_lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._answered = AnsweredInFull()  # 0.11: answered with a plain error; the frontend re-sends them
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

    def handle(self, data: list[Any], context: Any) -> list[str]:
        if self._failed is not None and not self._tracked:
            return self._failed.handle(data, context)
        replies = [""] * len(data)
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
        if not (self._tracked or self._answered):
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
        for request_id in [r for r in [*self._tracked, *self._answered] if r not in present]:
            self._cancel(request_id)
        if self.drain.expired:
            self.client.fail_all(drain.cut())
        step_before = self.client.steps
        for index, request_id in ids.items():
            if request_id not in self._tracked and request_id not in self._answered:
                self._admit(index, request_id, data[index], context)
        self.client.admissions_done()  # a step held for this call's arrivals may start
        live = [r for r in ids.values() if r in self._tracked]
        if not self.overlap:
            assert self.client.inline is not None
            self.client.inline.step()
        elif not any(r in self._answered or self._answerable(self._tracked[r]) for r in ids.values()):
            self.client.wait(live, step_before, self._wait_cap())
        news = self.client.take(live)
        planned: dict[int, _Reply] = {}
        for index, request_id in ids.items():
            if request_id in self._answered:  # 0.11 kept a job we answered in full: end it
                planned[index] = _Reply("", end=True)
                continue
            tracked = self._tracked[request_id]
            output, tracked.due = tracked.due, None
            if output is None and request_id in news:
                output = tracked.machine.feed(news[request_id])
                if tracked.machine.done:  # n > 1: a choice that failed ends its siblings too
                    self.client.release(request_id)
            reply = _merge(tracked, self._reply(tracked, output, index, context))
            if reply is not None:
                planned[index] = reply
        self._send(context, ids, planned, replies)
        self._report_engine()
        self._returned_at = time.perf_counter()

    def _send(self, context: Any, ids: dict[int, str], planned: dict[int, _Reply], replies: list[str]) -> None:
        """Put the planned replies in the call's answer; leave the others out of it."""
        if not ONE_SHOT_REPLIES and any(r.plain_error for r in planned.values()):
            self._errors_only(context, ids, planned, replies)
            return
        decisions = {index: self._ending(ids[index], reply) for index, reply in planned.items()}
        for index, reply in planned.items():
            replies[index] = reply.body
        for index in set(ids) - set(planned):
            del context.request_ids[index]  # nothing to say yet: the frontend keeps it in flight
        context.stopping_criteria = [_criterion(decisions.get(i, False)) for i in range(len(replies))]

    def _errors_only(self, context: Any, ids: dict[int, str], planned: dict[int, _Reply], replies: list[str]) -> None:
        """TorchServe 0.11 sends a 4xx/5xx body only as a plain response (a stream opened with
        such a status is closed after its headers), and it sets ts_stream_next on every reply of
        a call that has stopping criteria. So a call with plain errors answers only those, with
        no criteria; the other replies wait for the next call, which comes at once."""
        for index, request_id in ids.items():
            reply = planned.get(index)
            if reply is not None and reply.plain_error:
                replies[index] = reply.body
                tracked = self._tracked.pop(request_id, None)
                if tracked is not None and tracked.grpc:
                    end_grpc_reply(context, index)  # the frontend ends the job: no re-send to answer
                else:
                    self._answered.add(request_id)
                continue
            del context.request_ids[index]
            if reply is not None and request_id in self._tracked:
                self._tracked[request_id].stash = reply
        context.stopping_criteria = None

    def _wait_cap(self) -> float:
        """How long a call may wait for news: wake at the drain deadline to end what is left."""
        left = self.drain.seconds_left()
        return WAIT_CAP_S if left is None or left <= 0 else min(WAIT_CAP_S, left)

    def _admit(self, index: int, request_id: str, row: Any, context: Any) -> None:
        refusal = drain.refused() if self.drain.draining else None
        if self._failed is not None:
            refusal = self._failed.error
        work = self.service.prepare(index, row, context, refusal)
        tracked = self._tracked[request_id] = _Tracked(ResponseMachine(work, self.metrics.serving), work.grpc)
        tracked.due = tracked.machine.immediate()
        if tracked.due is None:
            self.client.submit(work)

    def _cancel(self, request_id: str) -> None:
        if self._answered.end(request_id):
            return
        tracked = self._tracked.pop(request_id)
        if self.client.release(request_id) and not tracked.closing:
            self.metrics.serving.cancelled()

    @staticmethod
    def _answerable(tracked: _Tracked) -> bool:
        """Has a reply without waiting for the engine."""
        return tracked.closing or tracked.stash is not None or tracked.due is not None

    @staticmethod
    def _reply(tracked: _Tracked, output: Output | None, index: int, context: Any) -> _Reply | None:
        if tracked.closing:
            return _Reply("", end=True)
        if output is None:
            return None
        if output.error is not None:
            status, phrase = tracked.machine.api.http_status(output.error)
            context.set_response_status(status, phrase, index)
        set_content_type(context, index, output.content_type)
        return _Reply(output.body, end=output.end, plain_error=output.whole and output.failed)

    def _ending(self, request_id: str, reply: _Reply) -> bool | None:
        """The stopping criterion for this reply: False continue, True last chunk, None one plain response."""
        tracked = self._tracked.get(request_id)
        if tracked is None:  # 0.11: a job answered in full, re-sent
            self._answered.end(request_id)
            return True
        if tracked.grpc:  # one reply, marked as the last (handler/serving/grpc_jobs.py)
            self._tracked.pop(request_id, None)
            return True
        if not reply.end:
            tracked.opened = True
            return False
        if tracked.opened or tracked.closing:
            self._tracked.pop(request_id, None)
            return True
        if ONE_SHOT_REPLIES:
            self._tracked.pop(request_id, None)
            return None
        tracked.opened = tracked.closing = True  # 0.11: this reply opens the stream, the next closes it
        return False

    def _fail_all(self, context: Any, replies: list[str], error: ServingError) -> None:
        """A bug in a call: answer everyone in it with `error`, in the form each one's state allows."""
        try:
            ids: dict[int, str] = dict(context.request_ids)
            planned: dict[int, _Reply] = {}
            for index, request_id in ids.items():
                tracked = self._tracked.get(request_id)
                if request_id in self._answered or (tracked is not None and tracked.closing):
                    planned[index] = _Reply("", end=True)
                    continue
                if tracked is None:
                    work = Work(index, request_id, NativeApi())
                    tracked = self._tracked[request_id] = _Tracked(ResponseMachine(work), grpc=False)
                tracked.stash = None
                self.client.release(request_id)
                output = tracked.due or (None if tracked.machine.done else tracked.machine.fail(error))
                planned[index] = self._reply(tracked, output, index, context) or _Reply("", end=True)
            self._send(context, ids, planned, replies)
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
        self.drain.stop()
        self.client.stop()
        if self._failed is not None:
            self._failed.shutdown()
        directory = state_dir()
        if self.replicas is not None and directory is not None:
            clear_replica_health(directory)


def _merge(tracked: _Tracked, reply: _Reply | None) -> _Reply | None:
    """A reply held back by an errors-only call goes out first, with whatever came since."""
    stash, tracked.stash = tracked.stash, None
    if stash is None:
        return reply
    if reply is None:
        return stash
    return _Reply(stash.body + reply.body, end=stash.end or reply.end, plain_error=stash.plain_error)


def _criterion(decision: bool | None):
    return lambda _reply: decision
