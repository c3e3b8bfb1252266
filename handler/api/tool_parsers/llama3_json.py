"""Llama 3.1+ JSON tool calls: `{"name": <function>, "parameters": <arguments>}` (some prompts get
"arguments" instead), optionally after `<|python_tag|>`, several separated by `;`.

The output is a call only if it starts (after blanks) with "{" or the tag. A call is committed
once `{"name": "<an offered function>", "parameters": {` is written; its arguments then stream
as they come. A call in another shape ("parameters" first, arguments as JSON text) is held
until its object closes. An object that is not a call to an offered function makes the whole
output content; after the calls, any other text is content.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Sequence
from typing import Any

from handler.api.common import compact_json
from handler.api.tool_parsers.base import (
    ArgumentsPiece,
    CallStart,
    FunctionSpec,
    Piece,
    TextPiece,
    ToolCall,
    ToolCallStream,
    ToolParser,
    new_call_id,
    register,
)
from handler.api.tool_parsers.json_calls import BLANKS, ObjectScanner, call_schema, object_end, skip_blanks
from handler.grammar.grammars import COMPACT_JSON
from handler.request import Constraint

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"
# What the constrained output puts between parallel calls (the parser takes any blanks around ";").
CONSTRAINED_SEPARATOR = "; "


class _Mode(enum.Enum):
    UNDECIDED = "undecided"  # only blanks (or part of the tag) so far
    CALLS = "calls"  # before a call: at the start, or after one (a separator, then the next)
    ARGUMENTS = "arguments"  # inside a committed call's arguments object
    CLOSING = "closing"  # after a call's arguments: its closing "}"
    TEXT = "text"  # the rest is content
    DONE = "done"  # max_calls reached, or the output ended inside a call: the rest is dropped


# A call's start, up to its arguments object opening: `{"name": "<function>", "parameters": {`.
_HEAD = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"(?:parameters|arguments)"\s*:\s*(?=\{)')


@register
class Llama3JsonParser(ToolParser):
    name = "llama3_json"

    def stream(self) -> ToolCallStream:
        return _Llama3Stream(self)

    @classmethod
    def constraint(cls, functions: Sequence[FunctionSpec], parallel: bool) -> Constraint:
        """One call as a JSON Schema; with `parallel`, one or more joined by "; " as a Lark grammar
        embedding that schema (`%json`), JSON kept compact as for response_format."""
        schema = call_schema(functions)
        if not parallel:
            return Constraint("json_schema", json.dumps(schema, ensure_ascii=False))
        embedded = json.dumps({**schema, "x-guidance": COMPACT_JSON}, ensure_ascii=False)
        return Constraint("lark", f'start: call ("{CONSTRAINED_SEPARATOR}" call)*\ncall: %json {embedded}\n')

    def call_from(self, text: str) -> ToolCall | None:
        """The call one JSON object spells, or None (not JSON, not a call, not an offered function)."""
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict) or obj.get("name") not in self.tool_names:
            return None
        arguments: Any = obj["parameters"] if "parameters" in obj else obj.get("arguments")
        if isinstance(arguments, str):  # arguments written as JSON text
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
        return ToolCall(obj["name"], compact_json(arguments))


class _Llama3Stream(ToolCallStream):
    def __init__(self, parser: Llama3JsonParser) -> None:
        self._parser = parser
        self._text = ""
        self._pos = 0  # output before this went out (as content or in calls)
        self._mode = _Mode.UNDECIDED
        self._calls = 0  # calls started
        self._arguments: ObjectScanner | None = None  # the current call's arguments object

    def feed(self, delta: str) -> list[Piece]:
        self._text += delta
        return self._advance(final=False)

    def end(self) -> list[Piece]:
        return self._advance(final=True)

    def _advance(self, final: bool) -> list[Piece]:
        if self._mode is _Mode.UNDECIDED:
            self._decide(final)
        pieces: list[Piece] = []
        while True:
            mode = self._mode
            if mode is _Mode.CALLS:
                progressed = self._next_call(pieces, final)
            elif mode is _Mode.ARGUMENTS:
                progressed = self._more_arguments(pieces, final)
            elif mode is _Mode.CLOSING:
                progressed = self._close_call(pieces, final)
            elif mode is _Mode.TEXT:
                rest = self._text[self._pos :]
                pieces += [TextPiece(rest)] if rest else []
                progressed = False
            else:
                progressed = False
            if not progressed:
                break
        if self._mode in (_Mode.TEXT, _Mode.DONE):
            self._pos = len(self._text)
        return pieces

    def _decide(self, final: bool) -> None:
        head = self._text.lstrip(BLANKS)
        if head.startswith(("{", PYTHON_TAG)):
            self._mode = _Mode.CALLS
        elif final or (head and not PYTHON_TAG.startswith(head)):
            self._mode = _Mode.TEXT

    def _next_call(self, pieces: list[Piece], final: bool) -> bool:
        """Between calls: the separator, then the next call's start. True when the state moved on."""
        text = self._text
        i = skip_blanks(text, self._pos)
        if self._calls == 0 and text.startswith(PYTHON_TAG, i):
            i = skip_blanks(text, i + len(PYTHON_TAG))
        elif self._calls > 0:
            if i == len(text):  # more may come; blanks after the last call are dropped
                return False
            if text[i] != SEPARATOR:
                self._mode = _Mode.TEXT
                return True
            i = skip_blanks(text, i + 1)
        if i == len(text) or text[i] != "{":
            if final or i < len(text):
                self._mode = _Mode.TEXT
                return True
            return False
        head = _HEAD.match(text, i)
        if head is not None:  # the name, then the arguments object opening: commit to the call
            name = json.loads(head.group(1))
            if name not in self._parser.tool_names:
                self._mode = _Mode.TEXT
                return True
            pieces.append(CallStart(self._calls, new_call_id(), name, text[self._pos : head.end()]))
            self._pos = head.end()
            self._arguments = ObjectScanner(head.end())
            self._mode = _Mode.ARGUMENTS
            return True
        end = object_end(text, i)  # another shape: decide once the object is whole
        if end is None:
            if final:
                self._mode = _Mode.TEXT
                return True
            return False
        call = self._parser.call_from(text[i:end])
        if call is None:
            self._mode = _Mode.TEXT
            return True
        pieces.append(CallStart(self._calls, call.id, call.name, text[self._pos : end]))
        pieces.append(ArgumentsPiece(self._calls, call.arguments, ""))
        self._pos = end
        self._call_done()
        return True

    def _more_arguments(self, pieces: list[Piece], final: bool) -> bool:
        """Inside a committed call's arguments: what the model wrote of them so far."""
        assert self._arguments is not None
        end = self._arguments.feed(self._text)
        upto = len(self._text) if end is None else end
        if upto > self._pos:
            chunk = self._text[self._pos : upto]
            pieces.append(ArgumentsPiece(self._calls, chunk, chunk))
            self._pos = upto
        if end is None:
            if final:  # cut short: the call keeps the arguments it has
                self._mode = _Mode.DONE
            return False
        self._mode = _Mode.CLOSING
        return True

    def _close_call(self, pieces: list[Piece], final: bool) -> bool:
        """After a committed call's arguments: the call object's own "}" (a missing one is forgiven)."""
        i = skip_blanks(self._text, self._pos)
        if i == len(self._text):
            if final:
                self._call_done()
            return final
        if self._text[i] == "}":
            pieces.append(ArgumentsPiece(self._calls, "", self._text[self._pos : i + 1]))
            self._pos = i + 1
        self._call_done()
        return True

    def _call_done(self) -> None:
        self._calls += 1
        self._arguments = None
        max_calls = self._parser.max_calls
        self._mode = _Mode.DONE if max_calls is not None and self._calls >= max_calls else _Mode.CALLS
