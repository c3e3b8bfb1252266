"""TorchServe's side of the continuous jobs: which requests it holds in flight, and how a call's
replies must be shaped for its frontend (the stopping criteria, gRPC's one reply, 0.11's rules).

On 0.12 a request answered in one reply gets no `ts_stream_next` header (a criterion returning
None): one plain response. 0.11 turns None into "continue", so there such a reply opens a stream
and the next call closes it with an empty last chunk, and keeps a job answered with a plain error
to re-send it (`AnsweredInFull`); and 0.11 sends a 4xx/5xx only as a plain response
(`_errors_only`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from handler.core.response import Output, ResponseMachine
from handler.serving.grpc_jobs import end_grpc_reply
from handler.serving.replies import AnsweredInFull
from handler.serving.ts_compat import ONE_SHOT_REPLIES


@dataclass
class Tracked:
    machine: ResponseMachine
    grpc: bool
    due: Output | None = None  # decided without the engine (a reply, an error while preparing)
    opened: bool = False  # a reply with ts_stream_next went out: status and headers are on the wire
    closing: bool = False  # 0.11: the whole answer went out; the next call ends the stream
    stash: Reply | None = None  # 0.11: a reply held back while a call carried only error responses
    asked: bool = False  # its response opened to learn whether its client is there; confirmed next call


@dataclass
class Reply:
    body: str
    end: bool  # the last reply for this request
    plain_error: bool = False  # a 4xx/5xx before anything was sent: must be one plain response


class Jobs:
    """The requests of the frontend's calls: those in flight (`tracked`), and 0.11's re-sent ones."""

    def __init__(self) -> None:
        self.tracked: dict[str, Tracked] = {}
        self.answered = AnsweredInFull()  # 0.11: answered with a plain error; the frontend re-sends them

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.tracked or request_id in self.answered

    def __bool__(self) -> bool:
        return bool(self.tracked or self.answered)

    def send(self, context: Any, ids: dict[int, str], planned: dict[int, Reply], replies: list[str]) -> None:
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

    def _errors_only(self, context: Any, ids: dict[int, str], planned: dict[int, Reply], replies: list[str]) -> None:
        """TorchServe 0.11 sends a 4xx/5xx body only as a plain response (a stream opened with
        such a status is closed after its headers), and it sets ts_stream_next on every reply of
        a call that has stopping criteria. So a call with plain errors answers only those, with
        no criteria; the other replies wait for the next call, which comes at once."""
        for index, request_id in ids.items():
            reply = planned.get(index)
            if reply is not None and reply.plain_error:
                replies[index] = reply.body
                tracked = self.tracked.pop(request_id, None)
                if tracked is not None and tracked.grpc:
                    end_grpc_reply(context, index)  # the frontend ends the job: no re-send to answer
                else:
                    self.answered.add(request_id)
                continue
            del context.request_ids[index]
            if reply is not None and request_id in self.tracked:
                self.tracked[request_id].stash = reply
        context.stopping_criteria = None

    def _ending(self, request_id: str, reply: Reply) -> bool | None:
        """The stopping criterion for this reply: False continue, True last chunk, None one plain response."""
        tracked = self.tracked.get(request_id)
        if tracked is None:  # 0.11: a job answered in full, re-sent
            self.answered.end(request_id)
            return True
        if tracked.grpc:  # one reply, marked as the last (handler/serving/grpc_jobs.py)
            self.tracked.pop(request_id, None)
            return True
        if not reply.end:
            tracked.opened = True
            return False
        if tracked.opened or tracked.closing:
            self.tracked.pop(request_id, None)
            return True
        if ONE_SHOT_REPLIES:
            self.tracked.pop(request_id, None)
            return None
        tracked.opened = tracked.closing = True  # 0.11: this reply opens the stream, the next closes it
        return False


def merge(tracked: Tracked, reply: Reply | None) -> Reply | None:
    """A reply held back by an errors-only call goes out first, with whatever came since."""
    stash, tracked.stash = tracked.stash, None
    if stash is None:
        return reply
    if reply is None:
        return stash
    return Reply(stash.body + reply.body, end=stash.end or reply.end, plain_error=stash.plain_error)


def _criterion(decision: bool | None):
    return lambda _reply: decision
