"""Per-request generation state: one object per request, with an explicit state."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from handler.engine.detokenizer import IncrementalDetokenizer
from handler.engine.stops import StopStringMatcher
from handler.errors import InvalidRequest, ServingError
from handler.request import GenerationRequest, PromptTokenLogprob, SlotRequest, TokenChoice


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


@dataclass(frozen=True)
class Progress:
    """What a Sequence did after its first `since` tokens: how a replica process reports its
    sequences to the worker's copies of them (handler/replicas/). The replica's Sequence
    decided everything here (its end included); the worker's copy only adopts it."""

    request_id: str
    since: int
    token_ids: tuple[int, ...]
    text: tuple[str, ...]  # one delta per token, as `append` returned them
    choices: tuple[TokenChoice, ...]  # one per token, when the request asked for logprobs
    state: State
    finish_reason: FinishReason | None
    error: ServingError | None
    prompt_logprobs: tuple[PromptTokenLogprob, ...]
    admitted_at: float | None
    first_token_at: float | None
    last_token_at: float | None


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
    choice_index: int = 0  # which of the request's `n` outputs this is
    response_id: str = ""  # the id of the response this output belongs to ("": request_id)

    def __post_init__(self) -> None:
        self.response_id = self.response_id or self.request_id
        self._detokenizer = IncrementalDetokenizer(self.tokenizer, self.prompt_ids)
        self._stops = StopStringMatcher(self.request.stop)
        self._history = np.empty(0, dtype=np.int64)  # prompt + output ids, filled up to `_history_filled`
        self._history_filled = 0

    def token_history(self) -> np.ndarray:
        """The prompt's and the output's token ids as one array (a view). Kept between calls and
        extended by what came since, so reading it every step (speculation's proposals) costs the
        new tokens, not the whole text."""
        total = len(self.prompt_ids) + len(self.token_ids)
        if total > len(self._history):
            grown = np.empty(max(total, 2 * len(self._history)), dtype=np.int64)
            grown[: self._history_filled] = self._history[: self._history_filled]
            self._history = grown
        if self._history_filled < total:
            prompt = len(self.prompt_ids)
            start = self._history_filled
            if start < prompt:
                self._history[start:prompt] = self.prompt_ids[start:]
                start = prompt
            self._history[start:total] = self.token_ids[start - prompt :]
            self._history_filled = total
        return self._history[:total]

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
            request.stop_token_ids,
            request.constraint,
            request.adapter,
        )

    @property
    def finished(self) -> bool:
        return self.state is not State.RUNNING

    @property
    def tokens_left(self) -> int:
        """Tokens this sequence may still generate (max_new_tokens less those it took)."""
        return self.request.max_new_tokens - self.completion_tokens

    def take(self, *choices: TokenChoice) -> str:
        """Take one step's tokens from the backend, in order (one from a prefill or a plain
        decode, several from a backend that decodes more a step); return the text that may be
        sent now. Exactly what taking them one at a time returns, joined: the token that ends
        the sequence (EOS, a stop token id or string, its length, a constraint failure) is the
        last one taken, and those after it are not taken at all (not counted, not in
        `token_ids`, `choices` or the text)."""
        deltas = []
        for choice in choices:
            if self.finished:
                break
            deltas.append(self._take_one(choice))
        return "".join(deltas)

    def _take_one(self, choice: TokenChoice) -> str:
        if choice.prompt:
            self.prompt_logprobs = choice.prompt
        if self.request.logprobs is not None:
            self.choices.append(choice)
        if choice.constraint_failure is not None:  # the output so far does not satisfy the constraint
            self.fail(
                InvalidRequest(f"the constraint could not be followed: {choice.constraint_failure}", "constraint")
            )
            return ""
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
        if token_id in self.request.stop_token_ids:
            return self._finish(FinishReason.STOP)
        text = self._detokenizer.add(token_id)
        # Before min_tokens no stop string ends the output (as vLLM): its text goes out as is.
        delta = self._stops.feed(text) if self.completion_tokens >= self.request.sampling.min_tokens else text
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

    def progress_since(self, since: int) -> Progress:
        """Everything after the first `since` generated tokens, and the state now."""
        return Progress(
            self.request_id,
            since,
            tuple(self.token_ids[since:]),
            tuple(self.text[since:]),
            tuple(self.choices[since:]),
            self.state,
            self.finish_reason,
            self.error,
            self.prompt_logprobs if since == 0 else (),
            self.admitted_at,
            self.first_token_at,
            self.last_token_at,
        )

    def adopt(self, progress: Progress) -> str:
        """Take what this sequence's replica copy did (`progress_since(len(self.token_ids))` there);
        return the new text."""
        if progress.since != len(self.token_ids):
            raise ValueError(
                f"request {self.request_id}: progress after {progress.since} tokens, this copy has "
                f"{len(self.token_ids)}"
            )
        self.token_ids.extend(progress.token_ids)
        self.text.extend(progress.text)
        self.choices.extend(progress.choices)
        self.completion_tokens = len(self.token_ids)
        self.prompt_logprobs = progress.prompt_logprobs or self.prompt_logprobs
        self.admitted_at = progress.admitted_at or self.admitted_at
        self.first_token_at = progress.first_token_at or self.first_token_at
        self.last_token_at = progress.last_token_at or self.last_token_at
        if not self.finished:
            self.state, self.finish_reason, self.error = progress.state, progress.finish_reason, progress.error
        return "".join(progress.text)

    @property
    def full_text(self) -> str:
        return "".join(self.text)
