"""Tool calling (issue 21) with the official `openai` client against a real torchserve serving the
tiny random model: `tools` with `tool_choice` required / named / auto / none, the arguments
checked by hand against the tool's `parameters`, streamed tool calls reassembled by the client's
own helpers, a history holding an assistant `tool_calls` message and a `tool` result, and the
400s. The random model calls a tool only when the grammar makes it: with `required` or a named
function every output must be a valid call."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from pydantic import BaseModel, Field

from tests.support.openai import E2E_MODEL_CONFIG

MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200  # the parameters below are bounded: a constrained call always completes well inside this
UNITS = ["celsius", "fahrenheit"]
ZONES = ["UTC", "CET", "PST"]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"type": "string", "enum": UNITS},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a time zone.",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "enum": ZONES}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, TIME]


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=12)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


@pytest.fixture(scope="module", autouse=True)
def _room_for_tools() -> None:
    """The tiny model's 512-token vocabulary spends about 2 characters a token: the tool
    instruction and these two tools render to about 600 prompt tokens."""
    n_positions = E2E_MODEL_CONFIG["handler"]["n_positions"]
    assert n_positions >= 1024, f"tests/support/openai.py serves n_positions {n_positions}: tool prompts need 1024"


@pytest.fixture(scope="module")
def client(openai_base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_base_url, api_key=api_key, max_retries=0, timeout=60)


def chat(client: openai.OpenAI, server, **kwargs: Any):
    kwargs.setdefault("messages", MESSAGES)
    kwargs.setdefault("max_tokens", MAX_TOKENS)
    return client.chat.completions.create(model=server.model_name, **kwargs)


def assert_valid_arguments(name: str, arguments: str) -> dict[str, Any]:
    """`arguments` is a JSON string valid against the named tool's parameters (checked by hand)."""
    args = json.loads(arguments)
    assert isinstance(args, dict), arguments
    if name == "get_weather":
        assert set(args) == {"city", "unit"}, arguments
        assert isinstance(args["city"], str) and len(args["city"]) <= 12, arguments
        assert args["unit"] in UNITS, arguments
    elif name == "get_time":
        assert set(args) == {"zone"} and args["zone"] in ZONES, arguments
    else:
        raise AssertionError(f"a call to {name!r}, which is no tool of the request")
    return args


def assert_tool_calls(message, finish_reason: str, names: set[str]) -> list[tuple[str, dict[str, Any]]]:
    """The message calls tools only (no text), each call well formed; (name, arguments) per call."""
    assert finish_reason == "tool_calls"
    assert message.tool_calls, message
    assert not message.content, message.content
    calls = []
    for call in message.tool_calls:
        assert call.type == "function" and call.id, call
        assert call.function.name in names, call
        calls.append((call.function.name, assert_valid_arguments(call.function.name, call.function.arguments)))
    assert len({call.id for call in message.tool_calls}) == len(message.tool_calls)  # ids are distinct
    return calls


@pytest.mark.parametrize("seed", [None, 1, 2], ids=["greedy", "seed1", "seed2"])
def test_required_gives_valid_tool_calls(client, server, seed):
    sampling = {"temperature": 0} if seed is None else {"seed": seed}
    choice = chat(client, server, tools=TOOLS, tool_choice="required", **sampling).choices[0]
    assert_tool_calls(choice.message, choice.finish_reason, {"get_weather", "get_time"})


def test_a_named_function_is_the_one_called(client, server):
    named = {"type": "function", "function": {"name": "get_time"}}
    choice = chat(client, server, tools=TOOLS, tool_choice=named, temperature=0).choices[0]
    calls = assert_tool_calls(choice.message, choice.finish_reason, {"get_time"})
    assert [name for name, _ in calls] == ["get_time"]


def test_parallel_tool_calls_false_gives_one_call(client, server):
    choice = chat(client, server, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, seed=3).choices[0]
    assert len(assert_tool_calls(choice.message, choice.finish_reason, {"get_weather", "get_time"})) == 1


def test_streamed_tool_calls_reassemble_to_the_same_calls(client, server):
    """The chunks follow OpenAI's tool_calls delta format: the client's stream helper
    (`chat.completions.stream`) and its chunk accumulator rebuild what the whole answer holds."""
    kwargs = {"tools": TOOLS, "tool_choice": "required", "temperature": 0}
    whole = chat(client, server, **kwargs).choices[0]
    expected = assert_tool_calls(whole.message, whole.finish_reason, {"get_weather", "get_time"})

    with client.chat.completions.stream(
        model=server.model_name, messages=MESSAGES, max_tokens=MAX_TOKENS, **kwargs
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    choice = final.choices[0]
    assert assert_tool_calls(choice.message, choice.finish_reason, {"get_weather", "get_time"}) == expected
    done = [e for e in events if e.type == "tool_calls.function.arguments.done"]
    assert [(e.name, json.loads(e.arguments)) for e in done] == expected

    state = ChatCompletionStreamState()
    chunks = list(chat(client, server, stream=True, **kwargs))
    for chunk in chunks:
        state.handle_chunk(chunk)
    choice = state.get_final_completion().choices[0]
    assert assert_tool_calls(choice.message, choice.finish_reason, {"get_weather", "get_time"}) == expected
    assert len(chunks) > 3  # the arguments came in pieces
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) <= {None}


def test_client_parse_with_a_strict_pydantic_tool_gives_parsed_arguments(client, server):
    out = client.chat.completions.parse(
        model=server.model_name,
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        tool_choice="required",
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert isinstance(call.function.parsed_arguments, GetWeather)
    assert_valid_arguments("get_weather", call.function.arguments)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_auto_answers_in_text_or_with_valid_tool_calls(client, server, stream: bool):
    kwargs = {"tools": TOOLS, "tool_choice": "auto", "seed": 4, "max_tokens": 24}
    if stream:
        state = ChatCompletionStreamState()
        for chunk in chat(client, server, stream=True, **kwargs):
            state.handle_chunk(chunk)
        # the snapshot, not get_final_completion(): that raises LengthFinishReasonError on "length"
        choice = state.current_completion_snapshot.choices[0]
    else:
        choice = chat(client, server, **kwargs).choices[0]
    if choice.message.tool_calls:
        assert_tool_calls(choice.message, choice.finish_reason, {"get_weather", "get_time"})
    else:
        assert choice.finish_reason in ("stop", "length")
        assert isinstance(choice.message.content, str)


def test_none_never_calls_a_tool(client, server):
    choice = chat(client, server, tools=TOOLS, tool_choice="none", max_tokens=16, temperature=0).choices[0]
    assert not choice.message.tool_calls and choice.finish_reason in ("stop", "length")


def test_a_history_with_a_tool_call_and_its_result_renders(client, server):
    messages = [
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'},
    ]
    out = chat(client, server, messages=messages, tools=TOOLS, max_tokens=8, temperature=0)
    assert out.choices[0].finish_reason in ("stop", "length", "tool_calls")
    plain = chat(client, server, messages=MESSAGES, tools=TOOLS, max_tokens=8, temperature=0)
    assert out.usage.prompt_tokens > plain.usage.prompt_tokens  # the call and its result are in the prompt


def test_a_tool_without_parameters_is_a_400_naming_it(client, server):
    tool = {"type": "function", "function": {"name": "ping", "description": "Ping."}}
    with pytest.raises(openai.BadRequestError) as excinfo:
        chat(client, server, tools=[WEATHER, tool], tool_choice="required")
    body = excinfo.value.body
    assert body["param"].startswith("tools"), body
    assert "parameters" in body["param"] + body["message"], body
    assert "ping" in body["message"] or "[1]" in body["param"], body  # the tool, by name or position
    assert chat(client, server, max_tokens=2).choices  # still serving


def test_a_named_function_that_is_no_tool_is_a_400(client, server):
    named = {"type": "function", "function": {"name": "launch_rocket"}}
    with pytest.raises(openai.BadRequestError) as excinfo:
        chat(client, server, tools=TOOLS, tool_choice=named)
    assert excinfo.value.body["param"].startswith("tool_choice"), excinfo.value.body
