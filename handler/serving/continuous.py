"""`scheduler.mode: continuous`: TorchServe's continuousBatching protocol onto the step engine.

With `continuousBatching: true` the frontend calls `handle()` again and again with every
request still in flight (re-sent with an empty body, on 0.11 without headers) plus new
arrivals; each call's reply for a request becomes one HTTP chunk, and the request stays
in flight while its stopping criterion says "not yet". So one call here:

1. requests we know that are missing from the call are gone (the client closed):
   abort them; new ones are prepared (parsed, tokenized) and submitted to the engine,
   or answered at once (a 4xx, a model listing);
2. wait until some request of the call has news, or the engine finished a step (so new
   arrivals join within a step); the engine keeps stepping meanwhile, so its next step
   overlaps this reply's round trip to the frontend;
3. reply for each request that has news; a request with none is left out of the reply
   (removed from `context.request_ids`, which is what the worker encodes), so nothing is
   written for it and the frontend keeps it in flight. That keeps a request's status line
   unwritten until it has its first text, a 4xx/5xx or, non-streamed, its whole body.

Ending a response: on 0.12 a request answered in one reply gets no `ts_stream_next` header
(a stopping criterion returning None): one plain response with its own status and
Content-Length. 0.11 turns None into "continue", so there such a reply opens a stream
("true") and the next call closes it with an empty last chunk ("false").

Nothing escapes `handle()`: an exception there would answer 503 to every request in
flight and drop them all.

Draining (handler/serving/drain.py): new requests get a 503; at the deadline the engine fails
whatever is still in it, and those requests end the way a failed step ends them (a last
error line, or a 503 if nothing was sent yet).

Replicas (`scheduler.replicas` > 1, handler/replicas/): the engine is the `ReplicaSet`, which
the same calls drive. Its health goes to the /ping plugin (`replicas-<pid>.json`: 200
"Degraded" while some replica serves, 503 "Unhealthy" while none does) and to the metrics;
a replica that gave up starting fails the worker (handler/serving/init_failure.py) once the
requests in flight are answered.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from handler.api.native import NativeApi
from handler.engine.interface import Engine
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine, Update
from handler.errors import EngineError, ServingError
from handler.replicas.model import ReplicatedModel
from handler.replicas.replica_set import Health, ReplicaSet, ReplicaStartError
from handler.serving import drain
from handler.serving.grpc_jobs import end_grpc_reply
from handler.serving.init_failure import FailedServing
from handler.serving.replies import AnsweredInFull, error_reply, set_content_type, wire_error
from handler.serving.service import GenerationService, Work
from handler.serving.state import clear_replica_health, state_dir, write_replica_health
from handler.serving.ts_compat import ONE_SHOT_REPLIES

logger = logging.getLogger(__name__)

# Longest a call waits for news; the engine answers each step well within it.
WAIT_CAP_S = 1.0
# How often a call looks for constraints compiled meanwhile (handler/grammar/compiler.py).
COMPILE_POLL_S = 0.02
# The frontend calls again at once while it holds a job of ours; this long without a call
# means it holds none, whatever is left in `_tracked` (a client that went away unnoticed).
IDLE_GAP_S = 2 * WAIT_CAP_S


@dataclass
class _Tracked:
    work: Work
    opened: bool = False  # a reply with ts_stream_next went out: status and headers are on the wire
    closing: bool = False  # 0.11: the whole answer went out; the next call ends the stream
    stash: _Reply | None = None  # 0.11: a reply held back while a call carried only error responses
    ended: set[int] = field(default_factory=set)  # n > 1: the choices whose last update was taken

    @property
    def sequence_ids(self) -> list[str]:
        return [s.request_id for s in self.work.sequences]


@dataclass
class _Reply:
    body: str
    end: bool  # the last reply for this request
    plain_error: bool = False  # a 4xx/5xx before anything was sent: must be one plain response


class ContinuousServing:
    def __init__(self, service: GenerationService) -> None:
        self.service = service
        settings = service.config.scheduler
        backend = service.backend
        self.replicas: ReplicaSet | None = backend.replicas if isinstance(backend, ReplicatedModel) else None
        # Without overlap (and so without replicas, which always step on their own) this thread runs
        # each step itself: `_inline` is that StepEngine.
        self._inline = (
            None
            if self.replicas
            else StepEngine(backend, settings.prefill_token_budget, admission_wait=settings.admission_wait)
        )
        self.engine: Engine = self.replicas or self._inline
        self.overlap = settings.overlap or self.replicas is not None
        self._failed: FailedServing | None = None  # a replica gave up starting: the worker fails
        self._health_lock = threading.Lock()
        self.step_timeout_s = service.config.handler.step_timeout_s
        self._tracked: dict[str, _Tracked] = {}
        self._answered = AnsweredInFull()  # 0.11: answered with a plain error; the frontend re-sends them
        self._returned_at: float | None = None  # when the last handle() returned (round trip)
        self._in_call = False
        self._left_call_at = 0.0  # perf_counter when the last handle() returned, whatever happened
        self.metrics = service.token_metrics
        self._context: Any = None  # the frontend's context (one object for the worker's life), for idle gauges
        self.engine.on_idle = self._idle_gauges
        if self.replicas is not None:
            self.replicas.on_health = self._replica_health
        if self.overlap:
            self.engine.start()
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

    # -- one call ----------------------------------------------------------------------
    def _handle(self, data: list[Any], context: Any, replies: list[str]) -> None:
        entered = time.perf_counter()
        self._context = context
        if self._returned_at is not None:
            self.metrics.round_trip(context, entered - self._returned_at)
        ids: dict[int, str] = dict(context.request_ids)
        present = set(ids.values())
        for request_id in [r for r in [*self._tracked, *self._answered] if r not in present]:
            self._cancel(context, request_id)
        if self.drain.expired:
            self.engine.fail_all(drain.cut())
        step_before = self.engine.steps
        for index, request_id in ids.items():
            if request_id not in self._tracked and request_id not in self._answered:
                self._admit(index, request_id, data[index], context)
        compiling = self._settle_compiling(ids)
        self.engine.admissions_done()  # a step held for this call's arrivals may start
        if self.overlap:
            if not any(r in self._answered or self._answerable(self._tracked[r]) for r in ids.values()):
                cap = min(self._wait_cap(), COMPILE_POLL_S) if compiling else self._wait_cap()
                self.engine.wait(ids.values(), step_before, cap)
            if compiling:
                self._settle_compiling(ids)
        else:
            assert self._inline is not None
            self._inline.step()
        stuck = self.engine.step_running_for()
        if stuck > self.step_timeout_s:  # a hung device call: answer now rather than hang every client
            logger.error("a model step has been running for %.0f s (step_timeout_s %.0f)", stuck, self.step_timeout_s)
            self._fail_all(context, replies, EngineError(f"the model did not finish a step within {stuck:.0f} s"))
            return
        updates = self.engine.take(s for r in ids.values() if r in self._tracked for s in self._tracked[r].sequence_ids)
        planned: dict[int, _Reply] = {}
        for index, request_id in ids.items():
            if request_id in self._answered:  # 0.11 kept a job we answered in full: end it
                planned[index] = _Reply("", end=True)
                continue
            tracked = self._tracked[request_id]
            tracked.work.index = index  # its place in this call, not in the first
            reply = _merge(tracked, self._reply_for(tracked, updates, context))
            if reply is not None:
                planned[index] = reply
        self._send(context, ids, planned, replies)
        self.metrics.engine_steps(context, self.engine.take_records(), self.engine.occupied, self.engine.waiting)
        if self.replicas is not None:
            self.metrics.replicas(context, self.replicas.health())
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
                if tracked is not None and tracked.work.grpc:
                    end_grpc_reply(context, index)  # the frontend ends the job: no re-send to answer
                else:
                    self._answered.add(request_id)
                continue
            del context.request_ids[index]
            if reply is not None and request_id in self._tracked:
                self._tracked[request_id].stash = reply
        context.stopping_criteria = None

    def _wait_cap(self) -> float:
        """How long a call may wait for news: wake at the drain deadline to end what is left
        (past it, the engine's next step fails them and the wait ends with that news)."""
        cap = min(WAIT_CAP_S, self.step_timeout_s)
        left = self.drain.seconds_left()
        return cap if left is None or left <= 0 else min(cap, left)

    def _admit(self, index: int, request_id: str, row: Any, context: Any) -> None:
        refusal = drain.refused() if self.drain.draining else None
        if self._failed is not None:
            refusal = self._failed.error
        work = self.service.prepare(index, row, context, refusal)
        self._tracked[request_id] = _Tracked(work)
        if self.service.settle(work):
            self._submit(work)

    def _submit(self, work: Work) -> None:
        for sequence in work.sequences:
            self.engine.submit(sequence)

    def _settle_compiling(self, ids: dict[int, str]) -> bool:
        """Submit the requests of this call whose constraint compiled meanwhile (a refused one has
        its error now); whether some are still compiling."""
        compiling = False
        for request_id in ids.values():
            tracked = self._tracked.get(request_id)
            if tracked is None or tracked.work.compiling is None:
                continue
            if self.service.settle(tracked.work):
                self._submit(tracked.work)
            else:
                compiling = True
        return compiling

    def _cancel(self, context: Any, request_id: str) -> None:
        if self._answered.end(request_id):
            return
        tracked = self._tracked.pop(request_id)
        if tracked.closing:
            return  # it ended normally; 0.11 just dropped our closing reply
        for sequence_id in tracked.sequence_ids:
            self.engine.abort(sequence_id)
        self.metrics.cancelled(context)

    # -- what to send ------------------------------------------------------------------
    @staticmethod
    def _answerable(tracked: _Tracked) -> bool:
        """Has a reply without waiting for the engine."""
        work = tracked.work
        return tracked.closing or tracked.stash is not None or work.error is not None or work.reply is not None

    def _reply_for(self, tracked: _Tracked, updates: dict[str, Update], context: Any) -> _Reply | None:
        work = tracked.work
        index = work.index
        if tracked.closing:
            return _Reply("", end=True)
        if work.reply is not None:  # answered without generating
            context.set_response_content_type(index, "application/json")
            return _Reply(work.reply, end=True)
        if work.error is not None:
            return self._error_reply(tracked, work.error, context)
        if len(work.sequences) > 1:
            news = [updates[s.request_id] for s in work.sequences if s.request_id in updates]
            return self._reply_for_choices(tracked, news, context)
        update = updates.get(work.request_id)
        if update is None:
            return None
        sequence = update.sequence
        set_content_type(context, index, work.api.content_type(sequence.request))
        if sequence.error is not None:
            error = wire_error(work.api, sequence.error)
            if not sequence.request.stream:
                return self._error_reply(tracked, error, context)
            prefix = work.api.chunk(sequence, update.text) if update.text else ""
            if tracked.opened or prefix:
                logger.info("request %s failed mid-stream: %s", work.request_id, error.message)
                return _Reply(prefix + work.api.error(error, midstream=True), end=True)
            return self._error_reply(tracked, error, context)
        if not sequence.request.stream:
            if not update.ended:
                return None  # one body, when it is whole
            self._finished(work, context)
            return _Reply(work.api.final(sequence), end=True)
        body = work.api.chunk(sequence, update.text) if update.text else ""
        if update.ended:
            self._finished(work, context)
            return _Reply(body + work.api.final(sequence), end=True)
        return _Reply(body, end=False) if body else None

    def _reply_for_choices(self, tracked: _Tracked, news: list[Update], context: Any) -> _Reply | None:
        """A request with several outputs (OpenAI `n`): each choice's chunks and its own last chunk as
        it ends; the response ends when every choice has. One choice failing fails the request."""
        work = tracked.work
        if not news:
            return None
        set_content_type(context, work.index, work.api.content_type(work.sequence.request))
        failed = next((u.sequence for u in news if u.sequence.error is not None), None)
        stream = work.sequence.request.stream
        body = ""
        if stream:
            for update in news:
                if update.text:
                    body += work.api.chunk(update.sequence, update.text)
                if update.ended and failed is None:
                    body += work.api.finish(update.sequence)
        if failed is not None:
            for sequence_id in tracked.sequence_ids:
                self.engine.abort(sequence_id)
            error = wire_error(work.api, failed.error)
            if stream and (tracked.opened or body):
                logger.info("request %s failed mid-stream: %s", work.request_id, error.message)
                return _Reply(body + work.api.error(error, midstream=True), end=True)
            return self._error_reply(tracked, error, context)
        tracked.ended.update(u.sequence.choice_index for u in news if u.ended)
        if len(tracked.ended) == len(work.sequences):
            for sequence in work.sequences:
                self._finished(work, context, sequence)
            return _Reply(body + work.api.close(work.sequences), end=True)
        return _Reply(body, end=False) if body else None

    def _error_reply(self, tracked: _Tracked, error: ServingError, context: Any) -> _Reply:
        work = tracked.work
        logger.info("request %s failed: %s %s", work.request_id, error.status, error.message)
        return _Reply(error_reply(context, work.index, work.api, error), end=True, plain_error=True)

    def _finished(self, work: Work, context: Any, sequence: Sequence | None = None) -> None:
        sequence = sequence or work.sequence
        self.service.log_request(work, sequence)
        self.metrics.request_finished(context, sequence)

    def _ending(self, request_id: str, reply: _Reply) -> bool | None:
        """The stopping criterion for this reply: False continue, True last chunk, None one plain response."""
        tracked = self._tracked.get(request_id)
        if tracked is None:  # 0.11: a job answered in full, re-sent
            self._answered.end(request_id)
            return True
        if tracked.work.grpc:  # one reply, marked as the last (handler/serving/grpc_jobs.py)
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
        try:
            ids: dict[int, str] = dict(context.request_ids)
            planned: dict[int, _Reply] = {}
            for index, request_id in ids.items():
                if request_id in self._answered:
                    planned[index] = _Reply("", end=True)
                    continue
                tracked = self._tracked.get(request_id)
                if tracked is None:
                    tracked = self._tracked[request_id] = _Tracked(Work(index, request_id, NativeApi()))
                tracked.work.index = index
                tracked.stash = None
                for sequence_id in tracked.sequence_ids:
                    self.engine.abort(sequence_id)
                if tracked.closing:
                    planned[index] = _Reply("", end=True)
                elif tracked.opened:
                    planned[index] = _Reply(tracked.work.api.error(error, midstream=True), end=True)
                else:
                    planned[index] = self._error_reply(tracked, error, context)
            self._send(context, ids, planned, replies)
        except Exception:
            logger.exception("could not answer the call after a failure")

    def _idle_gauges(self) -> None:
        """The engine went idle: report it now. A cancelled request with nothing else in flight
        gets no further frontend call, so the last call's gauges would otherwise stay up."""
        if self._context is not None:
            self.metrics.engine_steps(
                self._context, self.engine.take_records(), self.engine.occupied, self.engine.waiting
            )

    def _replica_health(self) -> None:
        """A replica went down, came back or gave up (from the replica set's threads, which may
        report at once: the state is read under a lock, so the last write is the latest)."""
        with self._health_lock:
            assert self.replicas is not None
            self._show_health(self.replicas.health())

    def _show_health(self, health: Health) -> None:
        directory = state_dir()
        try:
            if directory is not None and health.problem is None:
                clear_replica_health(directory)
            elif directory is not None:
                write_replica_health(directory, "Degraded" if health.ready else "Unhealthy", health.problem or "")
        except OSError:
            logger.exception("could not write the replicas' health into %s", directory)
        if health.failed is not None and self._failed is None:
            self.engine.fail_all(EngineError(f"the model's replicas failed: {health.failed}"))
            self._failed = FailedServing.start(ReplicaStartError(health.failed), self._context)

    def shutdown(self) -> None:
        self.drain.stop()
        self.engine.stop()
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
