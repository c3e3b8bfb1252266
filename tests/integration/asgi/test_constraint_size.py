"""Issue 42 item 3 on the ASGI frontend: a schema or grammar over handler.grammar.max_constraint_bytes
is refused on receipt, in its route's error shape naming the field, before anything compiles it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.frontend.model import ServedModel
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process, sim_config

LIMIT = 2048


def schema(description_chars: int) -> dict[str, Any]:
    """An object of one string property; its description makes up its size (descriptions count)."""
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "d" * description_chars}},
        "required": ["name"],
    }


HUGE, SMALL = schema(LIMIT), schema(10)
MESSAGES = [{"role": "user", "content": "A name?"}]


def response_format(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": value}}


def json_grammar(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json", "value": value}


def tools(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "record", "parameters": value}}]


SCHEMA_FORMAT = "response_format.json_schema.schema"
# (path, the body around a schema, the field a refusal names)
CASES = [
    ("/v1/chat/completions", lambda s: {"messages": MESSAGES, "response_format": response_format(s)}, SCHEMA_FORMAT),
    ("/v1/completions", lambda s: {"prompt": "A name?", "response_format": response_format(s)}, SCHEMA_FORMAT),
    ("/v1/chat/completions", lambda s: {"messages": MESSAGES, "tools": tools(s), "tool_choice": "required"}, "tools"),
    ("/generate", lambda s: {"inputs": "A name?", "parameters": {"grammar": json_grammar(s)}}, "parameters.grammar"),
    ("/predictions/llama", lambda s: {"prompt": "A name?", "grammar": json_grammar(s)}, "grammar"),
]
IDS = ["chat-response_format", "completions-response_format", "chat-tools", "tgi-grammar", "native-grammar"]


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path) -> Iterator[tuple[InProcessFrontend, list[Any]]]:
    config = sim_config(tiny_model_dir, grammar={"max_constraint_bytes": LIMIT})
    with running_in_process(ServedModel(config, tiny_model_dir)) as frontend:
        compiler = frontend.model.core.constraints  # type: ignore[union-attr]
        submitted: list[Any] = []
        submit = compiler.submit

        def recording_submit(constraint: Any) -> Any:
            submitted.append(constraint)
            return submit(constraint)

        compiler.submit = recording_submit
        yield frontend, submitted


@pytest.mark.parametrize(("path", "body", "field"), CASES, ids=IDS)
def test_an_oversized_constraint_is_refused_on_receipt_naming_its_field(served, path, body, field):
    frontend, submitted = served
    submitted.clear()
    reply = frontend.post(path, json=body(HUGE))
    if path == "/generate":  # TGI's validation error: 422, {"error", "error_type"}
        assert reply.status_code == 422, reply.text
        error = reply.json()
        assert error["error_type"] == "validation"
        assert error["error"].startswith(f"Input validation error: {field} is ")
    else:
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["param"] == field
        assert error["message"].startswith(f"{error['param']} is ")
        assert f"at most {LIMIT:,} bytes" in error["message"]
    assert submitted == []  # refused before its compile was even queued


@pytest.mark.parametrize(("path", "body", "field"), CASES, ids=IDS)
def test_a_constraint_within_the_limit_is_compiled_and_served(served, path, body, field):
    frontend, submitted = served
    submitted.clear()
    reply = frontend.post(path, json=body(SMALL))
    assert reply.status_code == 200, reply.text
    assert len(submitted) == 1
