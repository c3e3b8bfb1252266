"""Helpers for tool-call formats written as JSON objects: where an object in a text ends, and
JSON Schemas for "a call to one of these functions" that embed each function's own schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from handler.api.tool_parsers.base import FunctionSpec

BLANKS = " \t\r\n"


def skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in BLANKS:
        i += 1
    return i


class ObjectScanner:
    """Finds where a JSON object opening at `start` ("{") ends, over a text that grows: each
    `feed` scans only what was added. Braces inside strings do not count; whether the span is
    valid JSON is left to the JSON decoder."""

    def __init__(self, start: int) -> None:
        self._next = start
        self._depth = 0
        self._in_string = False
        self._escaped = False
        self.end: int | None = None  # the index after the closing "}", once seen

    def feed(self, text: str) -> int | None:
        i = self._next
        while self.end is None and i < len(text):
            char = text[i]
            i += 1
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char == "{":
                self._depth += 1
            elif char == "}":
                self._depth -= 1
                if self._depth == 0:
                    self.end = i
        self._next = i
        return self.end


def object_end(text: str, start: int) -> int | None:
    """Where the JSON object opening at `text[start]` ends (the index after its "}"), or None while
    it is unfinished."""
    return ObjectScanner(start).feed(text)


def call_schema(
    functions: Sequence[FunctionSpec], name_key: str = "name", arguments_key: str = "parameters"
) -> dict[str, Any]:
    """A JSON Schema for one call `{"<name_key>": <a function's name>, "<arguments_key>": <its
    arguments>}`: the function's own object when there is one, else `anyOf` with the name as a
    `const` (so the arguments must fit the function named). The keys come in that order, and the
    arguments are always a JSON object.

    A function schema with `$ref`s is moved under the root's `$defs` and its references
    re-pointed there: `#/$defs/X` inside a function's schema means its own root, which is no
    longer the document's root once it is embedded."""
    defs: dict[str, Any] = {}
    options = []
    for i, function in enumerate(functions):
        parameters = {k: v for k, v in function.parameters.items() if k != "$schema"}
        parameters.setdefault("type", "object")  # arguments are an object, even where the schema leaves it open
        if _has_ref(parameters):
            pointer = f"#/$defs/tool{i}"
            defs[f"tool{i}"] = _repointed(parameters, pointer)
            parameters = {"$ref": pointer}
        options.append(
            {
                "type": "object",
                "properties": {name_key: {"const": function.name}, arguments_key: parameters},
                "required": [name_key, arguments_key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    if defs:
        schema = {**schema, "$defs": defs}
    return schema


def _has_ref(node: Any) -> bool:
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for v in node.values())
    if isinstance(node, list):
        return any(_has_ref(v) for v in node)
    return False


def _repointed(node: Any, base: str) -> Any:
    """`node` with every local `$ref` ("#...") made relative to `base` instead of the root."""
    if isinstance(node, list):
        return [_repointed(v, base) for v in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            out[key] = base + value[1:]
        elif key == "properties" and isinstance(value, dict):  # property names, not keywords: "$ref" may be one
            out[key] = {name: _repointed(v, base) for name, v in value.items()}
        else:
            out[key] = _repointed(value, base)
    return out
