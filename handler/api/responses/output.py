"""A response's output text as its output items and, streamed, OpenAI's events for them.

The text goes through the request's tool parser (when it may hold calls), whose pieces become
items in order: text opens a `message` item (its one `output_text` part) and streams
`response.output_text.delta`; a call to a function opens a `function_call` item and streams
`response.function_call_arguments.delta`; a call to a custom tool (offered to the model as a
function taking `input`) becomes a `custom_tool_call` item once its arguments are whole. With a
custom tool forced by `tool_choice`, the whole output is that tool's input, streamed as
`response.custom_tool_call_input.delta`. Each item is closed (`.done` events, then
`response.output_item.done`) when the next one opens or the output ends.

A non-streamed response runs the same code and drops the events, so both shapes carry the same
items.
"""

from __future__ import annotations

import json
from typing import Any

from handler.api.common import compact_json
from handler.api.responses.conversation import CUSTOM_INPUT, new_id
from handler.api.tool_parsers import (
    ArgumentsPiece,
    CallStart,
    Piece,
    TextPiece,
    ToolCallStream,
    ToolParser,
    new_call_id,
)


class Events:
    """Server-sent events with OpenAI's `event:` line and an increasing `sequence_number`."""

    def __init__(self) -> None:
        self.sequence_number = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self.sequence_number, **fields}
        self.sequence_number += 1
        return f"event: {kind}\ndata: {compact_json(body)}\n\n"


class OutputStream:
    def __init__(
        self,
        events: Events,
        parser: ToolParser | None,
        custom_tools: frozenset[str] = frozenset(),
        forced_custom: str | None = None,
    ) -> None:
        self.events = events
        self.items: list[dict[str, Any]] = []
        self._calls: ToolCallStream | None = parser.stream() if parser is not None else None
        self._custom_tools = custom_tools
        self._forced_custom = forced_custom
        self._open: dict[str, Any] | None = None  # the item being written
        self._custom_arguments = ""  # a custom tool's call written as a function call: its arguments

    # -- the text ------------------------------------------------------------------------------
    def feed(self, delta: str) -> str:
        if self._forced_custom is not None:
            return self._custom_input(delta)
        pieces: list[Piece] = self._calls.feed(delta) if self._calls is not None else [TextPiece(delta)]
        return "".join(self._piece(piece) for piece in pieces)

    def end(self, status: str) -> str:
        """The output ended (`status`: completed or incomplete): what was held back, and the last
        item closed."""
        out = ""
        if self._forced_custom is not None and self._open is None:
            out += self._custom_input("")  # a forced custom call with empty input is still a call
        if self._calls is not None:
            out += "".join(self._piece(piece) for piece in self._calls.end())
        return out + self._close(status)

    @property
    def called(self) -> bool:
        return any(item["type"] != "message" for item in self.items)

    # -- items ---------------------------------------------------------------------------------
    def _piece(self, piece: Piece) -> str:
        if isinstance(piece, TextPiece):
            return self._text(piece.text) if piece.text else ""
        if isinstance(piece, CallStart):
            out = self._close("completed")
            if piece.name in self._custom_tools:
                self._open = {"type": "custom_json", "call_id": piece.id, "name": piece.name}
                self._custom_arguments = ""
                return out
            item = {
                "id": new_id("fc"),
                "type": "function_call",
                "status": "in_progress",
                "arguments": "",
                "call_id": piece.id,
                "name": piece.name,
            }
            return out + self._add(item)
        return self._arguments(piece)

    def _text(self, text: str) -> str:
        out = ""
        if self._open is not None and self._open["type"] != "message":
            out += self._close("completed")
        if self._open is None:
            item = {"id": new_id("msg"), "type": "message", "status": "in_progress", "role": "assistant", "content": []}
            out += self._add(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out += self.events(
                "response.content_part.added", item_id=item["id"], output_index=self._index, content_index=0, part=part
            )
            item["content"].append(part)
        assert self._open is not None
        self._open["content"][0]["text"] += text
        return out + self.events(
            "response.output_text.delta",
            item_id=self._open["id"],
            output_index=self._index,
            content_index=0,
            delta=text,
            logprobs=[],
        )

    def _arguments(self, piece: ArgumentsPiece) -> str:
        if self._open is None or not piece.text:
            return ""
        if self._open["type"] == "custom_json":
            self._custom_arguments += piece.text
            return ""
        self._open["arguments"] += piece.text
        return self.events(
            "response.function_call_arguments.delta",
            item_id=self._open["id"],
            output_index=self._index,
            delta=piece.text,
        )

    def _custom_input(self, delta: str) -> str:
        out = ""
        if self._open is None:
            assert self._forced_custom is not None
            item = {
                "id": new_id("ctc"),
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": new_call_id(),
                "name": self._forced_custom,
                "input": "",
            }
            out += self._add(item)
        assert self._open is not None
        if not delta:
            return out
        self._open["input"] += delta
        return out + self.events(
            "response.custom_tool_call_input.delta", item_id=self._open["id"], output_index=self._index, delta=delta
        )

    def _add(self, item: dict[str, Any]) -> str:
        self.items.append(item)
        self._open = item
        return self.events("response.output_item.added", output_index=self._index, item=item)

    @property
    def _index(self) -> int:
        return len(self.items) - 1

    def _close(self, status: str) -> str:
        item, self._open = self._open, None
        if item is None:
            return ""
        out = ""
        if item["type"] == "custom_json":  # a custom tool's call, written as a function call: whole now
            item = {
                "id": new_id("ctc"),
                "type": "custom_tool_call",
                "status": "in_progress",
                "call_id": item["call_id"],
                "name": item["name"],
                "input": "",
            }
            out += self._add(item)
            self._open = None
            item["input"] = custom_input(self._custom_arguments)
            if item["input"]:
                out += self.events(
                    "response.custom_tool_call_input.delta",
                    item_id=item["id"],
                    output_index=self._index,
                    delta=item["input"],
                )
        index = self.items.index(item)
        if item["type"] == "message":
            part = item["content"][0]
            out += self.events(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                logprobs=[],
            )
            out += self.events(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            )
        elif item["type"] == "function_call":
            out += self.events(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=item["arguments"],
            )
        else:
            out += self.events(
                "response.custom_tool_call_input.done", item_id=item["id"], output_index=index, input=item["input"]
            )
        item["status"] = status
        return out + self.events("response.output_item.done", output_index=index, item=item)


def custom_input(arguments: str) -> str:
    """A custom tool's input from the function-call arguments the model wrote (`{"input": ...}`);
    the arguments themselves when they are not that shape."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return parsed[CUSTOM_INPUT]
    return arguments
