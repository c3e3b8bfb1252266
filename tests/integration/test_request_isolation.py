"""Hostile requests beside a normal stream, through the real continuous handler and TorchServe's own
reply encoder (tests/support/torchserve_harness.py): each gets its 400, the stream is served whole, and
nothing reaches the step thread that could stall it."""

from __future__ import annotations

import json
import threading

import pytest

from handler.grammar import matchers
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.torchserve_harness import ContinuousFrontend, make_context

CHAT = {"url_path": "v1/chat/completions"}
COMPLETIONS = {"url_path": "v1/completions"}
BYSTANDER = {"prompt": "Today the weather is", "max_new_tokens": 60, "ignore_eos": True}


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    handler = Inf2StreamingHandler()
    config = {
        "continuousBatching": True,
        "batchSize": 8,
        "handler": {
            "model_checkpoint_dir": str(tiny_model_dir),
            "n_positions": 256,
            "max_new_tokens": 100,
            # llguidance's own "too big" comes after seconds of work: on a loaded machine (pytest-xdist
            # beside it) the default 10 s budget could end it first, with the other 400
            "grammar": {"compile_timeout_s": 120},
        },
        "scheduler": {"mode": "continuous", "n_slots": 4},
    }
    context = make_context(config, str(tiny_model_dir))
    handler.initialize(context)
    yield handler, context
    handler.shutdown()


@pytest.fixture
def frontend(served):
    handler, context = served
    yield ContinuousFrontend(handler, context, batch_size=8)
    assert handler.serving.engine.occupied == 0


def error_of(reply) -> dict:
    assert reply.status == 400, (reply.status, reply.body)
    return json.loads(reply.body)["error"]


@pytest.mark.parametrize(
    ("raw", "headers", "param"),
    [
        ('{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', CHAT, "model"),
        ('{"model": "m\\ud800", "prompt": "hi"}', COMPLETIONS, "model"),
        ('{"model": "m", "prompt": "a\\udfff"}', COMPLETIONS, "prompt"),
        ('{"prompt": "hi", "stop": ["\\ud800"]}', {}, "stop.0"),
        (
            '{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": '
            '{"type": "function", "function": {"name": "\\ud800"}}}',
            CHAT,
            "tool_choice.function.name",
        ),
    ],
    ids=["chat-model", "completions-model", "prompt", "native-stop", "tool-name"],
)
def test_a_lone_surrogate_is_a_400_and_the_stream_beside_it_goes_on(frontend, raw, headers, param):
    stream = frontend.submit(BYSTANDER)
    hostile = frontend.submit(raw, headers)
    frontend.run()  # TorchServe's create_predict_response encodes every reply: it raised here before
    assert error_of(frontend.replies[hostile])["param"] == param
    bystander = frontend.replies[stream]
    assert bystander.status == 200 and bystander.lines[-1]["usage"]["completion_tokens"] == 60


def test_json_nested_2000_deep_is_a_400(frontend):
    raw = '{"model": "m", "prompt": "hi", "response_format": ' + "[" * 2000 + "]" * 2000 + "}"
    (reply,) = frontend.serve([raw], [COMPLETIONS])
    assert "nested deeper than 64 levels" in error_of(reply)["message"]


def test_a_million_character_stop_string_is_refused_at_receipt(frontend):
    (reply,) = frontend.serve([{"prompt": "hi", "max_new_tokens": 3, "stop": "x" * 1_000_000}])
    error = error_of(reply)
    assert error["param"] == "stop" and "4096 characters" in error["message"]


def test_a_schema_too_large_to_compile_is_a_400_built_off_the_step_thread(frontend, monkeypatch):
    """12,000 optional properties: llguidance needs seconds, then gives up. That happens on the compile
    pool while the bystander's steps go on, and the 400's reason is one line of llguidance's words."""
    built_on: list[str] = []
    original = matchers.compiled

    def recording(*args, **kwargs):
        built_on.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(matchers, "compiled", recording)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(12_000)}}
    hostile = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}},
    }
    stream = frontend.submit({**BYSTANDER, "max_new_tokens": 100})
    refused = frontend.submit(hostile, CHAT)
    frontend.run()
    error = error_of(frontend.replies[refused])
    assert error["param"] == "response_format.json_schema.schema"
    assert "too big" in error["message"] and "\n" not in error["message"] and "backtrace" not in error["message"]
    assert built_on and all(name.startswith("grammar-compile") for name in built_on)
    bystander = frontend.replies[stream]
    assert bystander.lines[-1]["usage"]["completion_tokens"] == 100
    # the whole stream went out while the schema was still compiling (seconds; the stream takes far less)
    assert bystander.sent_at[-1] < frontend.replies[refused].sent_at[0]


def test_a_constraint_compiled_on_receipt_is_only_copied_in_its_prefill(frontend, monkeypatch):
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    built_on: list[str] = []
    original = matchers.limits  # asked for once per matcher built, never for a copy

    def recording(*args, **kwargs):
        built_on.append(threading.current_thread().name)
        return original(*args, **kwargs)

    monkeypatch.setattr(matchers, "limits", recording)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "where?"}],
        "max_tokens": 20,
        "response_format": {"type": "json_schema", "json_schema": {"name": "where", "schema": schema}},
    }
    (reply,) = frontend.serve([body], [CHAT])
    assert reply.status == 200, reply.body
    assert len(built_on) == 1 and built_on[0].startswith("grammar-compile")  # built once, on the pool


def test_n_beyond_the_slots_is_a_400_naming_n(frontend):
    (reply,) = frontend.serve([{"model": "m", "prompt": "hi", "n": 5, "max_tokens": 2}], [COMPLETIONS])
    error = error_of(reply)
    assert error["param"] == "n" and "at most 4 outputs" in error["message"]


def json_schema_chat(schema: dict, max_tokens: int = 60) -> dict:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "a tree"}],
        "max_tokens": max_tokens,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "#"},
        {"anyOf": [{"$ref": "#"}]},
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
        {"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]},
    ],
    ids=["root", "any-of-root", "defs-cycle", "required-root"],
)
def test_a_schema_with_no_finite_document_is_refused_on_receipt(frontend, schema):
    (reply,) = frontend.serve([json_schema_chat(schema)], [CHAT])
    error = error_of(reply)
    assert error["param"] == "response_format.json_schema.schema"
    assert "cannot be followed to the end" in error["message"]


def test_a_recursive_schema_that_can_stop_is_served_and_validates(frontend):
    tree = {
        "type": "object",
        "properties": {"v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 1}},
        "required": ["v"],
        "additionalProperties": False,
    }
    # Seeded: unseeded sampling from the random model sometimes nests past max_tokens (a 'length' finish).
    (reply,) = frontend.serve([{**json_schema_chat(tree, max_tokens=100), "seed": 7}], [CHAT])
    assert reply.status == 200, reply.body
    choice = json.loads(reply.body)["choices"][0]
    assert choice["finish_reason"] == "stop"
    node = json.loads(choice["message"]["content"])
    while True:  # every node has an integer v and at most one kid, as the schema says
        assert isinstance(node["v"], int) and set(node) <= {"v", "kids"}
        if not node.get("kids"):
            break
        (node,) = node["kids"]


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(frontend, monkeypatch):
    service = frontend.handler.serving.service
    tokenized: list[int] = []
    original = service.backend.encode

    def counting(text, *args, **kwargs):
        tokenized.append(len(text))
        return original(text, *args, **kwargs)

    monkeypatch.setattr(service.backend, "encode", counting)
    (reply,) = frontend.serve([{"prompt": "word " * 200_000, "max_new_tokens": 2}])  # 1 MB of text
    error = error_of(reply)
    assert error["param"] == "prompt" and "longer than the model's n_positions (256)" in error["message"]
    assert tokenized == []
    (reply,) = frontend.serve([{"prompt": "word " * 300, "max_new_tokens": 2}])  # near the limit: tokenized
    assert "n_positions" in error_of(reply)["message"] and tokenized == [1500]
