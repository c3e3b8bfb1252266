"""A Responses request's input as chat messages (what the model's chat template renders), and a
response's output as the messages a later turn continues from.

- `instructions` is a first system message; it is not carried over by `previous_response_id`
  (OpenAI's rule: each request gives its own).
- a message item keeps its role, `developer` as `system` (chat templates know no developer);
  its content parts' texts are joined.
- `function_call` items become an assistant message's `tool_calls` (consecutive ones, one message),
  `function_call_output` items `tool` messages answering their `call_id`.
- a custom tool is offered to the model as a function taking one string, `input`: its calls and
  outputs go through the template the same way, with `{"input": ...}` as the arguments.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from handler.api.responses.schemas import (
    ContentPart,
    CustomToolCallItem,
    CustomToolCallOutputItem,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    OtherItem,
)
from handler.errors import InvalidRequest

CUSTOM_INPUT = "input"  # the one argument a custom tool takes when offered as a function
TEXT_PARTS = ("input_text", "output_text", "text", "refusal")


def new_id(prefix: str) -> str:
    """An item id as OpenAI writes them: a prefix, `_`, and 48 hex digits."""
    return f"{prefix}_{secrets.token_hex(24)}"


def part_text(parts: str | list[ContentPart], param: str) -> str:
    if isinstance(parts, str):
        return parts
    texts = []
    for j, part in enumerate(parts):
        if part.type not in TEXT_PARTS:
            raise InvalidRequest(
                f"'{param}[{j}].type': {part.type!r} parts are not served: this server reads text only",
                f"{param}[{j}].type",
            )
        texts.append(part.text or "")
    return "".join(texts)


def input_messages(items: str | list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(chat messages for the template, the input items as stored and listed, each with an id)."""
    if isinstance(items, str):
        if not items:
            return [], []
        item = {
            "id": new_id("msg"),
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": items}],
        }
        return [{"role": "user", "content": items}], [item]
    messages: list[dict[str, Any]] = []
    listed: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if isinstance(item, OtherItem):
            raise InvalidRequest(
                f"'{param}.type': {item.type!r} items are not served (messages, function_call, function_call_output, "
                "custom_tool_call and custom_tool_call_output are)",
                f"{param}.type",
            )
        listed.append(
            {**item.model_dump(exclude_none=True, by_alias=True), "id": item.id or new_id(_ID_PREFIX[item.type])}
        )
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": part_text(item.content, f"{param}.content")})
        elif isinstance(item, FunctionCallItem | CustomToolCallItem):
            _append_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem | CustomToolCallOutputItem):
            output = part_text(item.output, f"{param}.output")
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": output})
    return messages, listed


_ID_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
}


def _append_call(messages: list[dict[str, Any]], item: FunctionCallItem | CustomToolCallItem) -> None:
    if isinstance(item, FunctionCallItem):
        call = template_call(item.call_id, item.name, item.arguments)
    else:
        call = template_call(item.call_id, item.name, json.dumps({CUSTOM_INPUT: item.input}))
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
        last["tool_calls"].append(call)  # one assistant turn, several calls
    else:
        messages.append({"role": "assistant", "content": "", "tool_calls": [call]})


def template_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    """A call as chat templates take it: `arguments` a dict (Llama 3.1's writes `arguments | tojson`),
    kept as text when it is not a JSON object."""
    try:
        parsed: Any = json.loads(arguments)
    except ValueError:
        parsed = arguments
    if not isinstance(parsed, dict):
        parsed = arguments
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": parsed}}


def output_messages(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A response's output items as the chat messages a later turn continues from."""
    messages: list[dict[str, Any]] = []
    for item in output:
        if item["type"] == "message":
            text = "".join(part.get("text", "") for part in item["content"])
            messages.append({"role": "assistant", "content": text})
        elif item["type"] == "function_call":
            _append_call(messages, FunctionCallItem.model_validate(item))
        elif item["type"] == "custom_tool_call":
            _append_call(messages, CustomToolCallItem.model_validate(item))
    return messages
