"""OpenAI `n` and the receipt checks of structured output through the real handler with the tiny
model (tests/support/torchserve_harness.py drives it as TorchServe's frontends do): n outputs per
request, each seeded with seed + i; and the 400s a constraint or a token id gets on receipt."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.inf2_handler import Inf2StreamingHandler
from tests.support.modes import tiny_model_yaml
from tests.support.torchserve_harness import ContinuousFrontend, make_context, run_batch

N_SLOTS = 4
COMPLETIONS = {"url_path": "v1/completions"}
CHAT = {"url_path": "v1/chat/completions"}
PROMPT = "Today the weather is"


@pytest.fixture(scope="module")
def frontend(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(tiny_model_yaml(tiny_model_dir, "continuous", N_SLOTS), str(tiny_model_dir))
    handler.initialize(context)
    yield ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
    handler.shutdown()


def one(frontend: ContinuousFrontend, body: dict[str, Any], headers: dict | None = None):
    (reply,) = frontend.serve([body], [headers or COMPLETIONS])
    return reply


def events(body: str) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_n_streams_every_choice_with_its_own_end(frontend):
    body = {"prompt": PROMPT, "n": 3, "max_tokens": 12, "stream": True, "temperature": 1.0, "seed": 7}
    reply = one(frontend, {**body, "stream_options": {"include_usage": True}})
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    chunks = events(reply.body)
    *choice_chunks, usage = chunks
    texts = {0: "", 1: "", 2: ""}
    ends = {0: [], 1: [], 2: []}
    for chunk in choice_chunks:
        (choice,) = chunk["choices"]
        texts[choice["index"]] += choice["text"]
        if choice["finish_reason"] is not None:
            ends[choice["index"]].append(choice["finish_reason"])
    assert all(len(reasons) == 1 for reasons in ends.values()), ends
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] > 12  # the three outputs together
    assert len(set(texts.values())) > 1  # three draws, not one output three times


def test_choice_i_samples_with_seed_plus_i(frontend):
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 1.0}
    together = json.loads(one(frontend, {**body, "n": 3, "seed": 40}).body)
    assert [c["index"] for c in together["choices"]] == [0, 1, 2]
    alone = [json.loads(one(frontend, {**body, "seed": 40 + i}).body)["choices"][0]["text"] for i in range(3)]
    assert [c["text"] for c in together["choices"]] == alone
    prompt_tokens = together["usage"]["prompt_tokens"]
    assert together["usage"]["total_tokens"] == prompt_tokens + together["usage"]["completion_tokens"]


def test_chat_n_gives_each_choice_its_role_and_message(frontend):
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 6, "seed": 3, "stream": True}
    chunks = events(one(frontend, body, CHAT).body)
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role") == "assistant"]
    assert sorted(roles) == [0, 1]  # each choice's first chunk says whose message it is
    whole = json.loads(one(frontend, {**body, "stream": False}, CHAT).body)
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert all(c["message"]["role"] == "assistant" for c in whole["choices"])


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {}}}}},
            "response_format.json_schema.schema",
            "if",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "response_format.json_schema.schema",
            "required",
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}},
            "response_format.json_schema.schema",
            "JSON Schema object",
        ),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos", "EOS"),
        ({"logit_bias": {"999999": 5}}, "logit_bias", "outside the vocabulary"),
        ({"logit_bias": {"x": 5}}, "logit_bias", "token ids"),
        ({"logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
        ({"stop_token_ids": [-1]}, "stop_token_ids", "outside the vocabulary"),
        ({"presence_penalty": 3}, "presence_penalty", "between -2 and 2"),
        ({"n": 9}, "n", "between 1 and 8"),
        ({"best_of": 2}, "best_of", "not supported"),
        ({"suffix": "end"}, "suffix", "not supported"),
    ],
)
def test_what_cannot_be_served_is_refused_by_name(frontend, body, param, words):
    reply = one(frontend, {"prompt": PROMPT, "max_tokens": 4, **body})
    error = json.loads(reply.body)["error"]
    assert (reply.status, error["param"]) == (400, param), error
    assert words in error["message"]


def test_neutral_values_of_refused_fields_are_accepted(frontend):
    reply = one(frontend, {"prompt": PROMPT, "max_tokens": 2, "best_of": 1, "suffix": "", "n": 1})
    assert reply.status == 200


def test_static_mode_refuses_n(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(tiny_model_yaml(tiny_model_dir, "static", N_SLOTS), str(tiny_model_dir))
    handler.initialize(context)
    try:
        bad, good = run_batch(
            handler, context, [{"prompt": PROMPT, "n": 2}, {"prompt": PROMPT, "max_tokens": 3}], [COMPLETIONS] * 2
        )
    finally:
        handler.shutdown()
    assert (bad.status, good.status) == (400, 200)
    assert json.loads(bad.final)["error"]["param"] == "n"
