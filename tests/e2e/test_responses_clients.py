"""OpenAI's Responses API (issue 44) through real servers and unmodified client libraries: one torchserve
(continuous, token auth on) and one ASGI frontend (`python -m handler.frontend`, uvicorn), each serving the
real default model (SmolLM2-135M-Instruct, tests/support/real_model.py: it writes real text and ends it with
EOS, so a response ends `completed` unless max_output_tokens cuts it; the tiny model never ends on its own)
and started once for the module. Each client points at TorchServe's path, `/predictions/<model>/1.0/v1`.

- the official `openai` client: `responses.create` plain, with `instructions` (the system turn), cut by
  max_output_tokens (`incomplete`); `responses.stream(...)` with every event in order and its deltas making
  the final text; `responses.parse(text_format=...)`; a stored response retrieved, its input items listed,
  continued by `previous_response_id`, deleted (on the ASGI frontend: TorchServe passes no HTTP method);
- the OpenAI Agents SDK (`openai-agents`): an Agent with one function tool on `OpenAIResponsesModel`, run
  (`Runner.run` and `Runner.run_streamed`) to its final output: tool_choice `required` makes the first turn
  a call, the SDK resets it after the call, and the second turn answers in text;
- LangChain's `ChatOpenAI(use_responses_api=True)`: invoke, stream, bind_tools (langchain-openai 1.x needs
  Python 3.11+: those tests skip on the 3.10 stack of `make test-compat`).

TorchServe 0.11 (`make test-compat`) passes no url_path to its handler: a body is routed by its shape, and
one with `input` (and no prompt, messages or inputs) is an embeddings request, a 400 from a generation
archive; its run of this module skips. The in-process matrix (every event type, custom tools, refusals)
is tests/integration/responses/."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from pydantic import BaseModel, Field

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.asgi_frontend import ASGI, AsgiFrontend
from tests.support.openai import one_server, openai_url, server_key
from tests.support.real_model import REAL_MODEL_CONFIG, real_model_dir, real_tokenizer
from tests.support.torchserve_process import TorchServe

__all__ = ["real_model_dir", "real_tokenizer"]

pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/e2e/conftest.py)

QUESTION = "What is the capital of France?"
MAX_TOKENS = 48  # the answers here take 8 to 20 tokens; a runaway one still ends soon
EVENTS_BEFORE_DELTAS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
]
EVENTS_AFTER_DELTAS = [
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]
NOT_ROUTED_ON_0_11 = (
    "TorchServe 0.11 passes no url_path to its handler: a body is routed by its shape, and a Responses body "
    "(`input`, no prompt, messages or inputs) reads as an embeddings request, refused by a generation archive"
)


@pytest.fixture(scope="module", params=("torchserve", ASGI))
def served(
    request: pytest.FixtureRequest, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe | AsgiFrontend]:
    """One server at a time: the torchserve, stopped, then the ASGI frontend."""
    if request.param != ASGI and not has_secure_defaults():
        pytest.skip(NOT_ROUTED_ON_0_11)
    with one_server(request.param, tmp_path_factory.mktemp("responses"), real_model_dir, REAL_MODEL_CONFIG) as server:
        yield server


@pytest.fixture
def client(served: TorchServe | AsgiFrontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_url(served), api_key=server_key(served), max_retries=0, timeout=120)


def prompt_tokens(tokenizer: Any, messages: list[dict[str, str]]) -> int:
    """The tokens of `messages` as the server renders them (the chat template, the assistant's turn opened)."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def ask(client: openai.OpenAI, server: TorchServe | AsgiFrontend, **fields: Any) -> Any:
    """A greedy `responses.create` of QUESTION (the fields given replace the defaults)."""
    fields = {"input": QUESTION, "max_output_tokens": MAX_TOKENS, "temperature": 0, **fields}
    return client.responses.create(model=server.model_name, **fields)


# -- the openai client ---------------------------------------------------------------------------------------
def test_create_answers_in_one_message_with_its_usage(served, client, real_tokenizer):
    response = ask(client, served)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == served.model_name
    assert response.status == "completed" and response.incomplete_details is None and response.error is None
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.status == "completed"
    assert [part.type for part in message.content] == ["output_text"]
    assert "Paris" in response.output_text
    usage = response.usage
    assert usage.input_tokens == prompt_tokens(real_tokenizer, [{"role": "user", "content": QUESTION}])
    # the text's tokens and the EOS that ended it
    assert usage.output_tokens == len(real_tokenizer(response.output_text, add_special_tokens=False)["input_ids"]) + 1
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens


def test_instructions_are_the_system_turn_and_are_echoed(served, client, real_tokenizer):
    instructions = "Answer in one short sentence."
    response = ask(client, served, instructions=instructions)
    assert response.instructions == instructions and response.status == "completed" and response.output_text
    rendered = [{"role": "system", "content": instructions}, {"role": "user", "content": QUESTION}]
    assert response.usage.input_tokens == prompt_tokens(real_tokenizer, rendered)
    # the template's default system turn would have been there otherwise
    assert response.usage.input_tokens != prompt_tokens(real_tokenizer, [{"role": "user", "content": QUESTION}])


def test_max_output_tokens_reached_is_incomplete(served, client):
    whole = ask(client, served)
    cut = ask(client, served, max_output_tokens=3)
    assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens"
    assert cut.usage.output_tokens == 3 and cut.output[0].status == "incomplete"
    assert cut.output_text and whole.output_text.startswith(cut.output_text)  # greedy: the same first tokens


def test_stream_sends_every_event_in_order_and_its_deltas_make_the_final_text(served, client):
    with client.responses.stream(
        model=served.model_name, input=QUESTION, max_output_tokens=MAX_TOKENS, temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert deltas and kinds == EVENTS_BEFORE_DELTAS + ["response.output_text.delta"] * len(deltas) + EVENTS_AFTER_DELTAS
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert final.status == "completed" and final.id == events[0].response.id
    assert final.output_text == "".join(deltas) == events[-4].text
    assert final.output_text == ask(client, served).output_text  # greedy: streamed or not, the same text


class Capital(BaseModel):
    city: str = Field(max_length=24)
    country: str = Field(max_length=24)


def test_parse_with_a_pydantic_text_format_gives_the_parsed_object(served, client):
    parsed = client.responses.parse(
        model=served.model_name,
        input="Paris is the capital of France. Give the city and its country.",
        text_format=Capital,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert parsed.status == "completed"  # the schema's end: the only token left is EOS
    assert isinstance(parsed.output_parsed, Capital)
    assert Capital.model_validate_json(parsed.output_text) == parsed.output_parsed


def test_a_stored_response_is_retrieved_listed_continued_and_deleted(served, client):
    first = ask(client, served, metadata={"test": "stored"})
    assert client.responses.retrieve(first.id).model_dump() == first.model_dump()
    items = client.responses.input_items.list(first.id)
    assert [(item.type, item.role, item.content[0].text) for item in items.data] == [("message", "user", QUESTION)]
    follow = ask(client, served, input="And of Italy?", previous_response_id=first.id)
    assert follow.previous_response_id == first.id and follow.status == "completed"
    # the conversation so far came first: the question, the answer, the new question
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    if isinstance(served, TorchServe):
        # TorchServe passes its handler no HTTP method: a DELETE reads as a GET (docs/openai.md#responses)
        client.responses.delete(first.id)
        assert client.responses.retrieve(first.id).id == first.id
        return
    top_level = openai.OpenAI(base_url=f"{served.url}/v1", api_key=server_key(served), max_retries=0, timeout=120)
    assert top_level.responses.retrieve(first.id).model_dump() == first.model_dump()  # one store, both paths
    client.responses.delete(first.id)  # through TorchServe's path, which the ASGI frontend serves too
    with pytest.raises(openai.NotFoundError) as gone:
        top_level.responses.retrieve(first.id)
    assert "deleted" in gone.value.message


# -- the OpenAI Agents SDK -----------------------------------------------------------------------------------
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "run_streamed"])
def test_an_agent_calls_its_function_tool_then_answers(served, streamed: bool):
    import agents

    agents.set_tracing_disabled(True)
    cities: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"The weather in {city} is sunny."

    async def run() -> tuple[Any, list[str]]:
        model_client = openai.AsyncOpenAI(
            base_url=openai_url(served), api_key=server_key(served), max_retries=0, timeout=120
        )
        agent = agents.Agent(
            name="weather",
            instructions="You answer questions about the weather.",
            tools=[get_weather],
            model=agents.OpenAIResponsesModel(model=served.model_name, openai_client=model_client),
            # required: the first turn is a call; the SDK then resets tool_choice (Agent.reset_tool_choice), so
            # the second turn may answer in text
            model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=MAX_TOKENS),
        )
        question = "What is the weather in Tokyo?"
        try:
            if not streamed:
                return await agents.Runner.run(agent, question, max_turns=3), []
            result = agents.Runner.run_streamed(agent, question, max_turns=3)
            raw = [event.data.type async for event in result.stream_events() if event.type == "raw_response_event"]
            return result, raw
        finally:
            await model_client.close()

    result, raw_events = asyncio.run(run())
    assert [city.strip().lower() for city in cities] == ["tokyo"]  # the tool ran once, with valid arguments
    kinds = [type(item).__name__ for item in result.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], result.new_items
    call = result.new_items[0].raw_item
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": cities[0]}
    assert [response.response_id.startswith("resp_") for response in result.raw_responses] == [True, True]
    assert isinstance(result.final_output, str) and result.final_output.strip(), result.final_output
    assert result.final_output == result.new_items[-1].raw_item.content[0].text
    if streamed:  # the call's events, then the answer's
        turns = [raw_events[: raw_events.index("response.completed") + 1]]
        turns.append(raw_events[len(turns[0]) :])
        assert "response.function_call_arguments.done" in turns[0] and "response.output_text.done" in turns[1]
        assert [turn[-1] for turn in turns] == ["response.completed", "response.completed"]


# -- LangChain -----------------------------------------------------------------------------------------------
def chat_model(server: TorchServe | AsgiFrontend) -> Any:
    langchain_openai = pytest.importorskip(
        "langchain_openai", reason="langchain-openai is installed on Python 3.11+ only (requirements-dev.txt)"
    )
    return langchain_openai.ChatOpenAI(
        use_responses_api=True,
        base_url=openai_url(server),
        api_key=server_key(server),
        model=server.model_name,
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=120,
    )


def test_langchain_invokes_and_streams_the_same_answer(served):
    llm = chat_model(served)
    message = llm.invoke(QUESTION)
    assert "Paris" in message.text
    assert message.response_metadata["status"] == "completed"
    assert message.response_metadata["id"].startswith("resp_")
    usage = message.usage_metadata
    assert usage["output_tokens"] > 0 and usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    chunks = list(llm.stream(QUESTION))
    assert sum(bool(chunk.text) for chunk in chunks) > 1  # the text came in pieces
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole += chunk
    assert whole.text == message.text  # greedy: streamed or not, the same text
    assert whole.response_metadata["status"] == "completed" and whole.usage_metadata == usage


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=24)


def test_langchain_bind_tools_gives_a_tool_call(served):
    """A tool's name forces that tool; `any` is LangChain's word for OpenAI's `required`. strict: without
    additionalProperties false the schema admits more keys, and the 135M model writes some."""
    llm = chat_model(served)
    for tool_choice in ("GetWeather", "any"):
        message = llm.bind_tools([GetWeather], tool_choice=tool_choice, strict=True).invoke(
            "What is the weather in Tokyo?"
        )
        assert message.tool_calls and not message.invalid_tool_calls, message
        (call,) = message.tool_calls
        assert call["name"] == "GetWeather" and call["id"].startswith("call_")
        assert GetWeather.model_validate(call["args"]).city.lower() == "tokyo"
        assert message.response_metadata["status"] == "completed"
