"""Issue 44 on the ASGI frontend in-process with the official `openai` client, and the same requests
through the TorchServe harness: plain, streamed (every event type in order), structured output,
forced function and custom tools, continuations by `previous_response_id` and by the whole input,
the stored responses' routes, and the refusals, each naming its field."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import openai
import pydantic
import pytest

from handler import failpoints
from tests.support.asgi_inprocess import InProcessFrontend
from tests.support.torchserve_harness import ContinuousFrontend

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
# A custom tool's grammar whose language is also this regular expression (no Lark parser in the tests).
PATCH_GRAMMAR = 'start: "BEGIN " NAME " END"\nNAME: /[a-z]{1,8}/\n'
PATCH_LANGUAGE = re.compile(r"BEGIN [a-z]{1,8} END")
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Apply a patch",
    "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR},
}


class City(pydantic.BaseModel):
    name: Literal["Paris", "Rome", "Oslo"]
    capital: bool


def events_of(text: str) -> list[dict[str, Any]]:
    """Server-sent events as OpenAI writes them: `event: <type>` then `data: <json>`, a blank line."""
    assert text.endswith("\n\n"), text[-200:]
    out = []
    for block in text.split("\n\n")[:-1]:
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: ") :])
        assert event["type"] == kind[len("event: ") :]
        out.append(event)
    return out


# -- the ASGI frontend, the openai client ------------------------------------------------------------
def test_a_plain_response_and_its_usage(asgi: InProcessFrontend, client: openai.AsyncOpenAI):
    response = asgi.run(client.responses.create(model="llama", input="Hello", max_output_tokens=8, temperature=0))
    assert response.object == "response" and response.id.startswith("resp_") and response.model == "llama"
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "incomplete"
    assert response.output_text and message.content[0].type == "output_text"
    assert response.usage.output_tokens == 8
    assert response.usage.total_tokens == response.usage.input_tokens + 8
    with_instructions = asgi.run(
        client.responses.create(
            model="llama", input="Hello", instructions="Answer in French.", max_output_tokens=8, temperature=0
        )
    )
    assert with_instructions.instructions == "Answer in French."
    assert with_instructions.usage.input_tokens > response.usage.input_tokens  # rendered as a system turn


def test_a_stream_sends_every_event_in_order_and_its_deltas_make_the_text(asgi, client):
    async def run() -> list[Any]:
        stream = await client.responses.create(
            model="llama", input="Hello", max_output_tokens=12, temperature=0, stream=True
        )
        return [event async for event in stream]

    events = asgi.run(run())
    kinds = [e.type for e in events]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in deltas)
    final = events[-1].response
    assert text == events[-4].text == final.output_text and final.usage.output_tokens == 12
    assert len({events[0].response.id, final.id}) == 1
    whole = asgi.run(client.responses.create(model="llama", input="Hello", max_output_tokens=12, temperature=0))
    assert whole.output_text == text  # greedy: streamed or not, the same text


def test_parse_with_a_pydantic_text_format_gives_valid_json(asgi, client):
    parsed = asgi.run(
        client.responses.parse(model="llama", input="Which city?", text_format=City, max_output_tokens=64)
    )
    assert parsed.status == "completed"  # the schema's end: the only token left is EOS
    assert isinstance(parsed.output_parsed, City)


def test_a_forced_function_tool_gives_a_function_call_item(asgi, client):
    response = asgi.run(
        client.responses.create(
            model="llama",
            input="Weather in Paris?",
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=64,
        )
    )
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    assert response.status == "completed"


def test_a_custom_tool_with_a_lark_grammar_gives_input_in_its_language(asgi, client):
    response = asgi.run(
        client.responses.create(
            model="llama",
            input="Patch it",
            tools=[PATCH],
            tool_choice={"type": "custom", "name": "apply_patch"},
            max_output_tokens=32,
        )
    )
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert PATCH_LANGUAGE.fullmatch(call.input), call.input


def test_a_tool_output_continues_by_previous_response_id_and_by_the_whole_input(asgi, client):
    first = asgi.run(
        client.responses.create(
            model="llama",
            input="Weather in Paris?",
            tools=[WEATHER],
            tool_choice="required",
            parallel_tool_calls=False,  # one call, then the end (a second one could be cut at max_output_tokens)
            max_output_tokens=64,
            temperature=0,
        )
    )
    (call,) = first.output
    assert call.type == "function_call"
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}
    chained = asgi.run(
        client.responses.create(
            model="llama",
            previous_response_id=first.id,
            input=[result],
            tools=[WEATHER],
            max_output_tokens=8,
            temperature=0,
        )
    )
    assert chained.previous_response_id == first.id and chained.output
    whole_input = [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        result,
    ]
    unstored = asgi.run(
        client.responses.create(
            model="llama", input=whole_input, tools=[WEATHER], store=False, max_output_tokens=8, temperature=0
        )
    )
    # the same conversation either way: the same prompt, so the same greedy output
    assert unstored.usage.input_tokens == chained.usage.input_tokens
    assert unstored.output_text == chained.output_text
    with pytest.raises(openai.NotFoundError):
        asgi.run(client.responses.retrieve(unstored.id))


def test_stored_responses_are_retrieved_listed_and_deleted(asgi, client):
    response = asgi.run(
        client.responses.create(model="llama", input="Hello", max_output_tokens=4, temperature=0, metadata={"k": "v"})
    )
    again = asgi.run(client.responses.retrieve(response.id))
    assert again.model_dump() == response.model_dump()

    async def listed() -> Any:
        return await client.responses.input_items.list(response.id)

    items = asgi.run(listed())
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Hello")]
    asgi.run(client.responses.delete(response.id))
    with pytest.raises(openai.NotFoundError) as gone:
        asgi.run(client.responses.retrieve(response.id))
    assert "deleted" in gone.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        asgi.run(client.responses.create(model="llama", input="x", previous_response_id="resp_nope"))
    assert unknown.value.body["param"] == "previous_response_id"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"background": True}, "background"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"truncation": "auto"}, "truncation"),
        ({"tool_choice": {"type": "function", "name": "nope"}, "tools": [WEATHER]}, "tool_choice"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
        ({"max_output_tokens": 100000}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"model": "other"}, "model"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"input": ""}, "input"),
    ],
)
def test_each_refusal_names_its_field(asgi, extra, param):
    body = {"model": "llama", "input": "Hello", **extra}
    response = asgi.post("/v1/responses", json=body)
    assert response.status_code in (400, 404), response.text
    assert response.json()["error"]["param"] == param, response.text


# -- the TorchServe adapter ---------------------------------------------------------------------
def test_torchserve_serves_a_turn_its_stream_and_a_continuation(torchserve: ContinuousFrontend):
    route = {"url_path": "v1/responses"}
    body = {"model": "m", "input": "Hello", "max_output_tokens": 6, "temperature": 0}
    whole = torchserve.serve([body], [route])[0]
    assert whole.status == 200, whole.body
    response = json.loads(whole.body)
    assert response["status"] == "incomplete" and response["usage"]["output_tokens"] == 6
    streamed = torchserve.serve([{**body, "stream": True}], [route])[0]
    events = events_of(streamed.body)
    assert [e["type"] for e in events][:2] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.incomplete"
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == response["output"][0]["content"][0]["text"]
    stored = torchserve.serve([""], [{"url_path": f"v1/responses/{response['id']}"}])[0]
    assert json.loads(stored.body) == response
    follow = {"model": "m", "input": "More", "previous_response_id": response["id"], "max_output_tokens": 2}
    chained = json.loads(torchserve.serve([follow], [route])[0].body)
    assert chained["usage"]["input_tokens"] > response["usage"]["input_tokens"] + 6
    unknown = torchserve.serve([{**follow, "previous_response_id": "resp_nope"}], [route])[0]
    assert unknown.status == 404 and json.loads(unknown.body)["error"]["param"] == "previous_response_id"


def test_a_failure_after_the_head_is_a_response_failed_event_not_a_cut_stream(
    asgi, client, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(failpoints.ENV_VAR, "FAILHERE")  # the decode step after 8 tokens fails

    async def run() -> list[Any]:
        stream = await client.responses.create(
            model="llama", input="FAILHERE please", max_output_tokens=32, temperature=0, stream=True
        )
        return [event async for event in stream]

    events = asgi.run(run())
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert any(e.type == "response.output_text.delta" for e in events)
    failed = events[-1]
    assert failed.type == "response.failed" and failed.response.status == "failed"
    assert "generation failed" in failed.response.error.message
    assert [e.sequence_number for e in events] == list(range(len(events)))
