"""Logprobs as text: each token's text, offset and alternatives, and which of them a stream
has already sent. The wire formats (OpenAI legacy and chat, native) only reshape these.

A token's text is what it adds to the text decoded before it (a few tokens of context, as
the incremental detokenizer does, so SentencePiece's leading spaces survive), with special
tokens shown (`</s>`). Special tokens take no room in the response text, so they add
nothing to the offsets: `text_offset` indexes the text the response carries.

Streaming: a chunk carries the tokens whose text it completes (a token's end offset is
within the text sent so far); whatever is left goes with the last chunk, so every token
is sent once, in order, EOS included.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass
from typing import Any

from handler.engine.sequence import Sequence
from handler.request import PromptTokenLogprob, TokenChoice

CONTEXT_TOKENS = 4


@dataclass(frozen=True)
class Alternative:
    token_id: int
    text: str
    logprob: float


@dataclass(frozen=True)
class RenderedToken:
    token_id: int
    text: str
    logprob: float | None  # None: the prompt's first token (nothing before it)
    top: tuple[Alternative, ...] | None  # None: the prompt's first token
    offset: int  # where its text starts in the response text
    end: int  # where it ends (= offset for a special token)
    prompt: bool


class _Renderer:
    """Tokens of one sequence turned into RenderedTokens as they arrive."""

    def __init__(self, sequence: Sequence, base_offset: int, include_chosen: bool) -> None:
        self.tokenizer = sequence.tokenizer
        self.special = set(getattr(self.tokenizer, "all_special_ids", ()) or ())
        self.include_chosen = include_chosen
        self.tokens: list[RenderedToken] = []
        self.sent = 0
        self.prompt_done = False
        self.choices_done = 0
        self.offset = 0
        self.generated_base = base_offset  # echo: generated text starts after the echoed prompt
        self.context: list[int] = []

    def _text(self, token_id: int) -> str:
        window = self.context[-CONTEXT_TOKENS:]
        if not window:
            return self.tokenizer.decode([token_id], skip_special_tokens=False)
        before = self.tokenizer.decode(window, skip_special_tokens=False)
        after = self.tokenizer.decode([*window, token_id], skip_special_tokens=False)
        if after.startswith(before):
            return after[len(before) :]
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _add(self, token_id: int, logprob: float | None, top: Seq[tuple[int, float]] | None, prompt: bool) -> None:
        text = self._text(token_id)
        alternatives = None
        if top is not None:
            pairs = list(top)
            if self.include_chosen and logprob is not None and token_id not in {i for i, _ in pairs}:
                pairs.insert(0, (token_id, logprob))
            alternatives = tuple(Alternative(i, text if i == token_id else self._text(i), v) for i, v in pairs)
        width = 0 if token_id in self.special else len(text)
        self.tokens.append(
            RenderedToken(token_id, text, logprob, alternatives, self.offset, self.offset + width, prompt)
        )
        self.offset += width
        self.context.append(token_id)

    def update(self, sequence: Sequence, with_prompt: bool) -> None:
        if not self.prompt_done:
            self.prompt_done = True
            if with_prompt:
                for entry in sequence.prompt_logprobs:
                    self._add_prompt(entry)
            else:
                self.context = list(sequence.prompt_ids[-CONTEXT_TOKENS:])
            self.offset = self.generated_base
        for choice in sequence.choices[self.choices_done :]:
            self._add_choice(choice)
        self.choices_done = len(sequence.choices)

    def _add_prompt(self, entry: PromptTokenLogprob) -> None:
        top = None if entry.logprob is None else entry.top_logprobs
        self._add(entry.token_id, entry.logprob, top, prompt=True)

    def _add_choice(self, choice: TokenChoice) -> None:
        self._add(choice.token_id, choice.logprob, choice.top_logprobs, prompt=False)

    def take(self, text_sent: int | None) -> list[RenderedToken]:
        """The tokens not sent yet whose text ends within the first `text_sent` characters (None: all);
        prompt tokens go with the first chunk, which carries the echoed prompt."""
        start = self.sent
        while self.sent < len(self.tokens) and (
            text_sent is None or self.tokens[self.sent].prompt or self.tokens[self.sent].end <= text_sent
        ):
            self.sent += 1
        return self.tokens[start : self.sent]


class TokenLog:
    """One response's tokens as rendered so far and how much of its text has gone out: wire
    state, so it lives on the request's `Api` instance, not on the engine's `Sequence`."""

    def __init__(self) -> None:
        self._renderer: _Renderer | None = None
        self.text_sent = 0

    def sent(self, delta: str) -> int:
        """How much response text has gone out, counting `delta`."""
        self.text_sent += len(delta)
        return self.text_sent

    def take(
        self,
        sequence: Sequence,
        *,
        text_sent: int | None,
        with_prompt: bool,
        echo_offset: int = 0,
        include_chosen: bool = True,
    ) -> list[RenderedToken]:
        """The rendered tokens of `sequence` a response may send now (see the module docstring);
        `text_sent` is how much of the response text has been sent, this chunk included (None: the
        last chunk, everything left). `echo_offset`: the length of the echoed prompt, where the
        generated tokens' offsets start."""
        if self._renderer is None:
            self._renderer = _Renderer(sequence, echo_offset, include_chosen)
        self._renderer.update(sequence, with_prompt)
        return self._renderer.take(text_sent)


def as_bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def native_token(token: RenderedToken) -> dict[str, Any]:
    """The native route's shape of one token: {id, text, logprob, top_logprobs: [{id, text, logprob}]}."""
    top = None if token.top is None else [{"id": a.token_id, "text": a.text, "logprob": a.logprob} for a in token.top]
    return {"id": token.token_id, "text": token.text, "logprob": token.logprob, "top_logprobs": top}
