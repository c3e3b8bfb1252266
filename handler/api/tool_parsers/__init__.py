"""Tool-call parsers, one per model family's call format, chosen by name (as vLLM's
`--tool-call-parser`). `llama3_json` (Llama 3.1+) is the default; a family with another format
adds a module with a registered `ToolParser` subclass and is imported here."""

from __future__ import annotations

from handler.api.tool_parsers import llama3_json
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
    parser_for,
    parser_names,
    register,
)

DEFAULT_TOOL_PARSER = llama3_json.Llama3JsonParser.name

__all__ = [
    "DEFAULT_TOOL_PARSER",
    "ArgumentsPiece",
    "CallStart",
    "FunctionSpec",
    "Piece",
    "TextPiece",
    "ToolCall",
    "ToolCallStream",
    "ToolParser",
    "new_call_id",
    "parser_for",
    "parser_names",
    "register",
]
