"""Per-request generation state: one object per request, with an explicit state."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from handler.backends.base import SlotRequest
from handler.engine.detokenizer import IncrementalDetokenizer
from handler.engine.stops import StopStringMatcher
from handler.errors import ServingError
from handler.request import GenerationRequest, PromptTokenLogprob, TokenChoice


class State(enum.Enum):
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"


class FinishReason(str, enum.Enum):
    """A str that prints as its value, like enum.StrEnum (Python 3.11+ only)."""

    EOS = "eos"
    LENGTH = "length"
    STOP = "stop"

    def __str__(self) -> str:
        return self.value


@dataclass
class Sequence:
    """A request being generated; `append` turns each new token into text to send."""

    request: GenerationRequest
    prompt_ids: list[int]
    tokenizer: Any
    eos_token_ids: frozenset[int]
    request_id: str = ""
    received_at: float = field(default_factory=time.perf_counter)
    state: State = State.RUNNING
    finish_reason: FinishReason | None = None
    error: ServingError | None = None
    completion_tokens: int = 0
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)  # every generated token, EOS included
    choices: list[TokenChoice] = field(default_factory=list)  # kept when the request asked for logprobs
    prompt_logprobs: tuple[PromptTokenLogprob, ...] = ()  # from the prefill, when the request asked (echo)
    admitted_at: float | None = None  # given a slot (continuous) or its micro-batch started (static)
    first_token_at: float | None = None
    last_token_at: float | None = None

    def __post_init__(self) -> None:
        self._detokenizer = IncrementalDetokenizer(self.tokenizer, self.prompt_ids)
        self._stops = StopStringMatcher(self.request.stop)

    def slot_request(self, slot: int) -> SlotRequest:
        """What the backend needs to prefill this sequence into `slot`."""
        request = self.request
        return SlotRequest(
            slot,
            tuple(self.prompt_ids),
            request.sampling,
            request.ignore_eos,
            request.logprobs,
            request.prompt_logprobs,
        )

    @property
    def finished(self) -> bool:
        return self.state is not State.RUNNING

    def take(self, choice: TokenChoice) -> str:
        """Take one step's token from the backend; return the text that may be sent now."""
        if choice.prompt:
            self.prompt_logprobs = choice.prompt
        if self.request.logprobs is not None:
            self.choices.append(choice)
        return self.append(choice.token_id)

    def append(self, token_id: int) -> str:
        """Take one generated token; return the text that may be sent now."""
        now = time.perf_counter()
        self.first_token_at = self.first_token_at or now
        self.last_token_at = now
        self.completion_tokens += 1
        self.token_ids.append(token_id)
        if token_id in self.eos_token_ids and not self.request.ignore_eos:
            return self._finish(FinishReason.EOS)
        delta = self._stops.feed(self._detokenizer.add(token_id))
        if self._stops.stopped:
            return self._finish(FinishReason.STOP, delta)
        if self.completion_tokens >= self.request.max_new_tokens:
            return self._finish(FinishReason.LENGTH, delta)
        self.text.append(delta)
        return delta

    def fail(self, error: ServingError) -> None:
        if not self.finished:
            self.state = State.FAILED
            self.error = error

    def _finish(self, reason: FinishReason, delta: str = "") -> str:
        if reason is not FinishReason.STOP:
            delta += self._stops.feed(self._detokenizer.flush())
            delta = delta if self._stops.stopped else delta + self._stops.flush()
            reason = FinishReason.STOP if self._stops.stopped else reason
        self.text.append(delta)
        self.state = State.FINISHED
        self.finish_reason = reason
        return delta

    @property
    def full_text(self) -> str:
        return "".join(self.text)
