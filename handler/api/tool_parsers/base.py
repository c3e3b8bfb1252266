"""What a model family's tool-call parser provides (as vLLM's tool parsers do), and the registry
that names them.

A parser turns the model's output text into message content and tool calls, whole (`parse`)
or as it streams (`stream()`: feed text deltas, get `TextPiece` / `CallStart` /
`ArgumentsPiece` events, then `end()` for what was held back). `parse` is defined through the
stream, so a streamed response and a whole one split the same text the same way.

A call is committed once its start shows it is a call to an offered function (Llama 3.1 JSON:
the name, then the arguments object opening); its arguments then stream as the model writes
them, as OpenAI streams them. Output cut short (`length`) therefore ends in a call with
unfinished arguments, as OpenAI's does. A parser also says how to constrain output to its own
call format (`constraint`), for `tool_choice` "required" or a named function: the constrained
output always parses back into complete calls.
"""

from __future__ import annotations

import secrets
import string
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from handler.request import Constraint

_ID_ALPHABET = string.ascii_letters + string.digits
ID_LENGTH = 24


def new_call_id() -> str:
    """A tool call id as OpenAI writes them: `call_` and 24 letters or digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(ID_LENGTH))


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text, as OpenAI's `function.arguments`
    id: str = field(default_factory=new_call_id)

    def wire(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class FunctionSpec:
    """One tool as a constraint needs it: its name and its arguments' JSON Schema."""

    name: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class TextPiece:
    """Output text that is message content."""

    text: str

    @property
    def raw(self) -> str:
        return self.text


@dataclass(frozen=True)
class CallStart:
    """A tool call begins: its id and function name (its arguments follow in `ArgumentsPiece`s).
    `raw`, here and in the other pieces, is the output text the piece accounts for (blanks,
    separators and the call's own syntax included), so a stream can tell how much of the text
    (and which tokens' logprobs) it has sent."""

    index: int
    id: str
    name: str
    raw: str


@dataclass(frozen=True)
class ArgumentsPiece:
    """More of call `index`'s arguments text (a JSON object once all its pieces are joined;
    `text` may be "" for a piece that only accounts for output text)."""

    index: int
    text: str
    raw: str


Piece = TextPiece | CallStart | ArgumentsPiece


class ToolCallStream(ABC):
    """One output's incremental parse. Text that may still turn out to be a tool call is held
    back; everything fed comes out once, as content or inside a call, except blanks after the
    calls (and, past a parser's `max_calls`, the rest)."""

    @abstractmethod
    def feed(self, delta: str) -> list[Piece]:
        """The pieces `delta` completes (none while the text is undecided)."""

    @abstractmethod
    def end(self) -> list[Piece]:
        """The output ended: what was held back."""


def assemble(pieces: list[Piece]) -> tuple[str, list[ToolCall]]:
    """Pieces joined back into (content, calls)."""
    starts: dict[int, CallStart] = {}
    arguments: dict[int, str] = {}
    content = ""
    for piece in pieces:
        if isinstance(piece, TextPiece):
            content += piece.text
        elif isinstance(piece, CallStart):
            starts[piece.index] = piece
            arguments[piece.index] = ""
        else:
            arguments[piece.index] += piece.text
    calls = [ToolCall(start.name, arguments[i], start.id) for i, start in sorted(starts.items())]
    return content, calls


class ToolParser(ABC):
    """A model family's tool-call format; one instance per request, knowing the request's tools
    (a call to a function the request did not offer is content, not a call). With `max_calls`
    (`parallel_tool_calls: false` gives 1), output after that many calls is dropped, as the
    constrained output would have ended there."""

    name: ClassVar[str]

    def __init__(self, tool_names: Iterable[str], max_calls: int | None = None) -> None:
        self.tool_names = frozenset(tool_names)
        self.max_calls = max_calls

    @abstractmethod
    def stream(self) -> ToolCallStream:
        """A fresh incremental parse, for one output (one choice)."""

    @classmethod
    @abstractmethod
    def constraint(cls, functions: Sequence[FunctionSpec], parallel: bool) -> Constraint:
        """Output constrained to calls in this format, to one of `functions` (one or more calls,
        separated as the format separates them, when `parallel`), each call's arguments valid
        against its function's parameters."""

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        """The whole output as (content, calls): content is None when the output is only calls;
        text that is not a call to an offered function stays content, unchanged."""
        stream = self.stream()
        content, calls = assemble(stream.feed(text) + stream.end())
        if not calls:
            return text, []
        return (content if content.strip() else None), calls


_PARSERS: dict[str, type[ToolParser]] = {}


def register(cls: type[ToolParser]) -> type[ToolParser]:
    """Class decorator: the parser is known by its `name`."""
    _PARSERS[cls.name] = cls
    return cls


def parser_names() -> list[str]:
    return sorted(_PARSERS)


def parser_for(name: str) -> type[ToolParser]:
    """The parser class registered as `name`; ValueError naming the known ones otherwise."""
    try:
        return _PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(parser_names())}") from None
