"""One request's response, from prepared to last byte, whatever carries it.

`ResponseMachine` is fed what the engine produced for a request (`News`: its sequences'
updates, or a failure that ended it from outside: the step watchdog, a drain deadline, a
replica that gave up) and says what to send next as an `Output`: a part of a 200 stream (the
first one opens it: status line and headers), or a whole response (a reply answered without
generating, a non-streamed body, or an error before anything was sent). The frontends only
carry outputs: TorchServe's adapter as replies to its worker calls, the ASGI frontend as
`http.response.*` messages.

The rules both frontends answer by:
- nothing goes out until there is something to say, so a request that fails before its first
  text gets its own 4xx/5xx; after the head, a failure is the route's in-band error line (the one
  exception: `open`, for a frontend that must write to learn whether its client left);
- a non-streamed request is one body, when it is whole;
- several outputs (OpenAI `n`): each choice's chunks and its own last chunk as it ends, the
  response ends when every choice has; one choice failing fails the request (the frontend
  then aborts the rest through the engine client);
- a request that ended well is logged (one line) and counted (`request_finished`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol

from handler.core.preparation import Work
from handler.core.replies import wire_error
from handler.engine.outbox import Update
from handler.engine.sequence import Sequence
from handler.errors import Overloaded, ServingError

logger = logging.getLogger(__name__)

JSON = "application/json"


class FinishedRequests(Protocol):
    """Where a request that ended well, or was turned away, is counted (handler/core/metrics.py's
    ServingMetrics)."""

    def request_finished(self, sequence: Sequence) -> None: ...

    def rejected(self, reason: str) -> None: ...


@dataclass(frozen=True)
class Output:
    """What to send next. `whole`: a complete response (status, content type, body) and nothing
    went out before it; otherwise a part of a 200 stream whose first part opens it."""

    body: str
    content_type: str
    end: bool
    whole: bool = False
    status: int = 200
    error: ServingError | None = None  # a whole error response: its reason phrase comes from the route
    headers: tuple[tuple[str, str], ...] = ()  # more response headers (Retry-After)

    @property
    def failed(self) -> bool:
        return self.error is not None


@dataclass
class News:
    """What the engine client has for one request since it was last asked."""

    updates: list[Update] = field(default_factory=list)
    failure: ServingError | None = None  # ended from outside (watchdog, drain, replicas, refused constraint)
    ask_client: bool = False  # a slot is free for it: open the response to learn whether its client is there


class ResponseMachine:
    def __init__(self, work: Work, finished: FinishedRequests | None = None) -> None:
        self.work = work
        self.api = work.api
        self.finished = finished
        self.opened = False  # a part of a stream was emitted: status and headers are out
        self.done = False  # the last output was emitted
        self._ended: set[int] = set()  # n > 1: the choices that ended

    @property
    def content_type(self) -> str:
        sequence = self.work.sequence
        return JSON if sequence is None else self.api.content_type(sequence.request)

    @property
    def streamed(self) -> bool:
        sequence = self.work.sequence
        return sequence is not None and sequence.request.stream

    def immediate(self) -> Output | None:
        """The response of a request answered without the engine (its reply, or the error it got
        while being prepared); None when it goes to the engine."""
        if self.work.reply is not None:
            return self._emit(Output(self.work.reply, JSON, end=True, whole=True))
        if self.work.error is not None:
            return self.fail(self.work.error)
        return None

    def feed(self, news: News) -> Output | None:
        """What to send for this news; None when nothing is due yet."""
        if self.done:
            return None
        if news.failure is not None:
            return self._failed_with(news.failure, self._texts(news.updates))
        if news.ask_client:
            return self.open()
        if not news.updates:
            return None
        if len(self.work.sequences) > 1:
            return self._choices(news.updates)
        return self._single(news.updates)

    def open(self) -> Output:
        """Open the response before there is anything to say: its 200 status line and headers, no
        body. A frontend that notices a client left only when it writes to it does this before the
        request takes a slot; from then on a non-streamed body comes as the last part, and a failure
        as the route's error body under the 200 already sent."""
        return self._emit(Output("", self.content_type, end=False))

    def fail(self, error: ServingError, prefix: str = "") -> Output:
        """End the response with `error`: a whole error response when nothing went out (and no
        text is due), else the route's in-band error after `prefix`."""
        return self._failed_with(error, prefix)

    # -- one output ----------------------------------------------------------------------
    def _single(self, updates: list[Update]) -> Output | None:
        sequence = updates[-1].sequence
        text = "".join(u.text for u in updates)
        ended = any(u.ended for u in updates)
        if sequence.error is not None:
            return self._failed_with(wire_error(self.api, sequence.error), self._texts(updates))
        if not sequence.request.stream:
            if not ended:
                return None  # one body, when it is whole
            self._finished(sequence)
            return self._emit(Output(self.api.final(sequence), self.content_type, end=True, whole=not self.opened))
        body = self.api.chunk(sequence, text) if text else ""
        if ended:
            self._finished(sequence)
            body += self.api.final(sequence)
        if not (body or ended):
            return None
        return self._emit(Output(body, self.content_type, end=ended))

    def _choices(self, updates: list[Update]) -> Output | None:
        stream = self.streamed
        failed = next((u.sequence for u in updates if u.sequence.error is not None), None)
        body = ""
        if stream:
            for update in updates:
                if update.text:
                    body += self.api.chunk(update.sequence, update.text)
                if update.ended and failed is None:
                    body += self.api.finish(update.sequence)
        if failed is not None:
            assert failed.error is not None
            return self._failed_with(wire_error(self.api, failed.error), body)
        self._ended.update(u.sequence.choice_index for u in updates if u.ended)
        done = len(self._ended) == len(self.work.sequences)
        if done:
            for sequence in self.work.sequences:
                self._finished(sequence)
            body += self.api.close(self.work.sequences)
            return self._emit(Output(body, self.content_type, end=True, whole=not (stream or self.opened)))
        if not (stream and body):
            return None
        return self._emit(Output(body, self.content_type, end=False))

    def _texts(self, updates: list[Update]) -> str:
        """The chunks of text that came with a failure (sent before its error line when streamed)."""
        if not self.streamed:
            return ""
        return "".join(self.api.chunk(u.sequence, u.text) for u in updates if u.text)

    def _failed_with(self, error: ServingError, prefix: str) -> Output:
        if self.opened or prefix:
            logger.info("request %s failed mid-stream: %s", self.work.request_id, error.message)
            body = self.api.error(error, midstream=self.streamed)  # a non-streamed body: its error body
            return self._emit(Output(prefix + body, self.content_type, end=True))
        logger.info("request %s failed: %s %s", self.work.request_id, error.status, error.message)
        status, _ = self.api.http_status(error)
        body = self.api.error(error, midstream=False)
        headers = retry_after(error)
        if isinstance(error, Overloaded) and self.finished is not None:
            self.finished.rejected(error.reason)
        return self._emit(Output(body, JSON, end=True, whole=True, status=status, error=error, headers=headers))

    def _emit(self, output: Output) -> Output:
        self.opened = self.opened or not output.whole
        self.done = output.end
        return output

    def _finished(self, sequence: Sequence) -> None:
        log_request(sequence)
        if self.finished is not None:
            self.finished.request_finished(sequence)


def retry_after(error: ServingError) -> tuple[tuple[str, str], ...]:
    """The Retry-After header of an error that says when to retry (a 503 `Overloaded`)."""
    return () if error.retry_after_s is None else (("Retry-After", str(error.retry_after_s)),)


def log_request(sequence: Sequence) -> None:
    """The one line a request that ended well leaves in the log."""
    s = sequence
    ttft = (s.first_token_at - s.received_at) * 1000 if s.first_token_at else float("nan")
    total = ((s.last_token_at or s.received_at) - s.received_at) * 1000
    logger.info(
        "request %s: prompt_tokens=%d completion_tokens=%d ttft_ms=%.1f total_ms=%.1f finish_reason=%s",
        s.request_id,
        len(s.prompt_ids),
        s.completion_tokens,
        ttft,
        total,
        s.finish_reason.value if s.finish_reason is not None else "none",
    )
