"""Tool calling on the real model: with `required` or a named function the grammar makes the
output a call, and the model fills in the city the user asked about; given the tool's result
(tool_choice auto), it answers in text that uses it. On the first question with `auto` the
model decides: the answer is only checked to be well-formed (a valid call or text), and printed.

The chat template must offer the tools to the model: a template that ignores `tools` makes
every request here a 400 naming `tools` (handler/api/chat_template.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "The city's name, e.g. London"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
QUESTION = [{"role": "user", "content": "What's the weather in Tokyo?"}]
RESULT = '{"temperature_c": 18, "condition": "sunny"}'
MAX_TOKENS = 40


def chat(server, client, messages: list[dict[str, Any]], **fields: Any) -> Any:
    fields = {"tools": [WEATHER], "max_tokens": MAX_TOKENS, "temperature": 0, **fields}
    return client.chat.completions.create(model=server.model_name, messages=messages, **fields)


def weather_call(choice: Any) -> tuple[Any, dict[str, Any]]:
    """The one get_weather call of `choice`, with its parsed arguments."""
    assert choice.finish_reason == "tool_calls", choice
    assert choice.message.content is None, choice.message
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id and call.function.name == "get_weather"
    arguments = json.loads(call.function.arguments)
    assert set(arguments) == {"city"} and isinstance(arguments["city"], str)
    return call, arguments


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}], ids=["required", "named"]
)
def test_a_forced_call_asks_for_tokyos_weather_and_the_answer_uses_the_result(real_server, real_client, tool_choice):
    choice = chat(real_server, real_client, QUESTION, tool_choice=tool_choice, parallel_tool_calls=False).choices[0]
    call, arguments = weather_call(choice)
    print(f"tool_choice {tool_choice}: get_weather({call.function.arguments})")
    assert arguments["city"].strip().lower() == "tokyo"

    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(include={"id", "type", "function"})]},
        {"role": "tool", "tool_call_id": call.id, "content": RESULT},
    ]
    answer = chat(real_server, real_client, history, tool_choice="auto", max_tokens=60).choices[0]
    print(f"after the result: {answer.message.content!r} ({answer.finish_reason})")
    assert not answer.message.tool_calls
    assert answer.message.content and ("18" in answer.message.content or "sunny" in answer.message.content.lower())


def test_auto_gives_a_valid_call_or_text(real_server, real_client):
    choice = chat(real_server, real_client, QUESTION, tool_choice="auto").choices[0]
    if choice.message.tool_calls:
        call, _arguments = weather_call(choice)
        print(f"auto: called get_weather({call.function.arguments})")
    else:
        print(f"auto: answered in text: {choice.message.content!r} ({choice.finish_reason})")
        assert choice.message.content and choice.finish_reason in ("stop", "length")
