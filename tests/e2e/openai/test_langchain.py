"""langchain-openai's `ChatOpenAI`, unmodified, against a real torchserve serving the tiny random
model (issue 21): `with_structured_output` (its json_schema default and function_calling) returns
an instance of the pydantic model, and `bind_tools` with a forced `tool_choice` returns an
AIMessage whose `tool_calls` hold valid arguments. langchain-openai 1.x needs Python 3.11+, so
the stack of `make test-compat` (3.10) skips this module."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

langchain_openai = pytest.importorskip(
    "langchain_openai", reason="langchain-openai is installed on Python 3.11+ only (requirements-dev.txt)"
)
from langchain_core.messages import AIMessage  # after the skip: langchain-core comes with langchain-openai

from tests.support.openai import E2E_MODEL_CONFIG

MAX_TOKENS = 200  # the schemas below are bounded: a constrained answer always completes inside this


class Person(BaseModel):
    """A person."""

    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=150)


class GetWeather(BaseModel):
    """The current weather in a city."""

    city: str = Field(max_length=12)
    unit: str = Field(pattern="^(celsius|fahrenheit)$")


@pytest.fixture(scope="module", autouse=True)
def _room_for_tools() -> None:
    """Tools render to a few hundred prompt tokens with the tiny model's 512-token vocabulary."""
    n_positions = E2E_MODEL_CONFIG["handler"]["n_positions"]
    assert n_positions >= 1024, f"tests/support/openai.py serves n_positions {n_positions}: tool prompts need 1024"


@pytest.fixture(scope="module")
def llm(openai_base_url: str, api_key: str, server):
    return langchain_openai.ChatOpenAI(
        base_url=openai_base_url,
        api_key=api_key,
        model=server.model_name,
        temperature=0,
        max_tokens=MAX_TOKENS,
        max_retries=0,
        timeout=60,
    )


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_with_structured_output_returns_the_model(llm, method: str):
    person = llm.with_structured_output(Person, method=method).invoke("Describe a person.")
    assert isinstance(person, Person)
    assert len(person.name) <= 10 and 0 <= person.age <= 150


@pytest.mark.parametrize("tool_choice", ["GetWeather", "any"])
def test_bind_tools_with_tool_choice_gives_tool_calls(llm, tool_choice: str):
    """A tool's name forces that tool; `any` is LangChain's word for OpenAI's `required`."""
    message = llm.bind_tools([GetWeather], tool_choice=tool_choice).invoke("What is the weather in Paris?")
    assert isinstance(message, AIMessage)
    assert message.tool_calls and not message.invalid_tool_calls, message
    for call in message.tool_calls:
        assert call["name"] == "GetWeather" and call["id"]
        args = GetWeather.model_validate(call["args"])
        assert set(call["args"]) == {"city", "unit"} and args.unit in ("celsius", "fahrenheit")
    assert message.response_metadata["finish_reason"] == "tool_calls"
