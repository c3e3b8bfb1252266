"""Issue 42 item 3 through the real continuous handler and TorchServe's own reply encoder
(tests/support/torchserve_harness.py): a schema or grammar over handler.grammar.max_constraint_bytes
is refused on receipt, in its route's error shape naming the field, before anything compiles it,
and the stream beside it is served whole."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.inf2_handler import Inf2StreamingHandler
from tests.support.torchserve_harness import ContinuousFrontend, make_context

LIMIT = 2048
BYSTANDER = {"prompt": "Today the weather is", "max_new_tokens": 40, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "A name?"}]
SCHEMA_FORMAT = "response_format.json_schema.schema"


def schema(description_chars: int) -> dict[str, Any]:
    """An object of one string property; its description makes up its size (descriptions count)."""
    return {
        "type": "object",
        "properties": {"name": {"type": "string", "description": "d" * description_chars}},
        "required": ["name"],
    }


HUGE, SMALL = schema(LIMIT), schema(10)


def response_format(value: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": value}}


def tools(value: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": "record", "parameters": value}}]


# (TorchServe's url_path, the body around a schema, the field a refusal names)
CASES = [
    ("v1/chat/completions", lambda s: {"messages": MESSAGES, "response_format": response_format(s)}, SCHEMA_FORMAT),
    ("v1/completions", lambda s: {"prompt": "A name?", "response_format": response_format(s)}, SCHEMA_FORMAT),
    ("v1/chat/completions", lambda s: {"messages": MESSAGES, "tools": tools(s), "tool_choice": "required"}, "tools"),
    ("generate", lambda s: {"inputs": "A name?", "parameters": {"grammar": {"type": "json", "value": s}}}, None),
    (None, lambda s: {"prompt": "A name?", "grammar": {"type": "json", "value": s}}, "grammar"),
]
IDS = ["chat-response_format", "completions-response_format", "chat-tools", "tgi-grammar", "native-grammar"]


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    handler = Inf2StreamingHandler()
    config = {
        "continuousBatching": True,
        "batchSize": 8,
        "handler": {
            "model_checkpoint_dir": str(tiny_model_dir),
            "n_positions": 512,  # the tools, rendered into the prompt, take 330 tokens
            "default_max_new_tokens": 8,
            "max_new_tokens": 100,
            "grammar": {"max_constraint_bytes": LIMIT},
        },
        "scheduler": {"mode": "continuous", "n_slots": 4},
    }
    context = make_context(config, str(tiny_model_dir))
    handler.initialize(context)
    compiler = handler.serving.service.constraints
    submitted: list[Any] = []
    submit = compiler.submit

    def recording_submit(constraint: Any) -> Any:
        submitted.append(constraint)
        return submit(constraint)

    compiler.submit = recording_submit
    yield handler, context, submitted
    handler.shutdown()


@pytest.fixture
def frontend(served):
    handler, context, submitted = served
    submitted.clear()
    yield ContinuousFrontend(handler, context, batch_size=8), submitted
    assert handler.serving.engine.occupied == 0


@pytest.mark.parametrize(("url_path", "body", "field"), CASES, ids=IDS)
def test_an_oversized_constraint_is_refused_on_receipt_naming_its_field(frontend, url_path, body, field):
    frontend, submitted = frontend
    stream = frontend.submit(BYSTANDER)
    refused = frontend.submit(body(HUGE), {"url_path": url_path} if url_path else {})
    frontend.run()
    reply = frontend.replies[refused]
    if url_path == "generate":  # TGI's validation error: 422, {"error", "error_type"}
        assert reply.status == 422, reply.body
        assert json.loads(reply.body)["error"].startswith("Input validation error: parameters.grammar is ")
    else:
        assert reply.status == 400, reply.body
        error = json.loads(reply.body)["error"]
        assert error["param"] == field and error["message"].startswith(f"{field} is ")
        assert f"at most {LIMIT:,} bytes" in error["message"]
    assert submitted == []  # refused before its compile was even queued
    assert frontend.replies[stream].lines[-1]["usage"]["completion_tokens"] == 40


@pytest.mark.parametrize(("url_path", "body", "field"), CASES, ids=IDS)
def test_a_constraint_within_the_limit_is_compiled_and_served(frontend, url_path, body, field):
    frontend, submitted = frontend
    (reply,) = frontend.serve([body(SMALL)], [{"url_path": url_path} if url_path else {}])
    assert reply.status == 200, reply.body
    assert len(submitted) == 1
