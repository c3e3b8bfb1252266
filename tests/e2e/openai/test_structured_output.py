"""Structured output and the OpenAI sampling fields (issue 21) with the official `openai` client
against a real torchserve serving the tiny random model (hf backend, continuous batching; the
package's shared server, tests/support/openai.py).

A random model makes these strong tests: without a grammar its output is never JSON
(`test_without_a_constraint_the_random_model_writes_no_json`), with one every output must be.
Token ids are read back from completions' `logprobs.tokens`: in a byte-level BPE vocabulary each
ordinary token's text is its own (`token_ids` checks that a text names exactly one id)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import openai
import pytest
from pydantic import BaseModel, Field

from tests.support.structured import PERSON_SCHEMA, assert_person

MESSAGES = [{"role": "user", "content": "Describe a person as JSON."}]
PROMPT = "Once upon a time"
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON_SCHEMA, "strict": True}}
MAX_TOKENS = 200


def nested(depth: int) -> dict[str, Any]:
    """An object holding an object ... `depth` deep (two JSON levels each)."""
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}, "required": ["x"]}
    return schema


class Person(BaseModel):
    name: str = Field(max_length=10)
    age: int = Field(ge=0, le=150)


@pytest.fixture(scope="module")
def client(openai_base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_base_url, api_key=api_key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def token_ids(tiny_tokenizer):
    """text -> the one token id whose text it is (special tokens and ambiguous texts left out)."""
    by_text: dict[str, list[int]] = {}
    special = set(tiny_tokenizer.all_special_ids)
    for token_id in range(len(tiny_tokenizer)):
        if token_id not in special:
            by_text.setdefault(tiny_tokenizer.decode([token_id]), []).append(token_id)
    return {text: ids[0] for text, ids in by_text.items() if len(ids) == 1 and "\ufffd" not in text}


def chat(client: openai.OpenAI, server, **kwargs: Any):
    return client.chat.completions.create(model=server.model_name, messages=kwargs.pop("messages", MESSAGES), **kwargs)


def streamed_chat(client: openai.OpenAI, server, **kwargs: Any) -> tuple[str, list[str | None]]:
    """The streamed content, and every chunk's finish_reason (one choice)."""
    chunks = list(chat(client, server, stream=True, **kwargs))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, [c.choices[0].finish_reason for c in chunks if c.choices]


def completion_tokens(client: openai.OpenAI, server, prompt: str = PROMPT, **kwargs: Any) -> tuple[list[str], Any]:
    """A greedy completion's token texts (from logprobs) and its choice."""
    out = client.completions.create(model=server.model_name, prompt=prompt, temperature=0, logprobs=0, **kwargs)
    choice = out.choices[0]
    return list(choice.logprobs.tokens), choice


def parses_as_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except json.JSONDecodeError:
        return False


def bad_request(call, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The error object of `call(*args, **kwargs)`, which must be a 400."""
    with pytest.raises(openai.BadRequestError) as excinfo:
        call(*args, **kwargs)
    assert excinfo.value.status_code == 400
    return excinfo.value.body


# -- response_format -------------------------------------------------------------------
def test_without_a_constraint_the_random_model_writes_no_json(client, server):
    """The control: what the grammar tests see is the grammar's doing, not the model's."""
    out = chat(client, server, max_tokens=40, temperature=0, extra_body={"ignore_eos": True})
    text = out.choices[0].message.content
    assert text and not parses_as_object(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_json_object_output_is_one_json_object(client, server, stream: bool):
    # Any object: strings are unbounded, and most seeds run out of tokens inside one ("length");
    # seed 8 completes a 186-token object with the tiny model. The pairing holds either way.
    kwargs = {"response_format": {"type": "json_object"}, "max_tokens": MAX_TOKENS, "seed": 8, "temperature": 1}
    if stream:
        text, finishes = streamed_chat(client, server, **kwargs)
        assert set(finishes[:-1]) <= {None}
        finish = finishes[-1]
    else:
        choice = chat(client, server, **kwargs).choices[0]
        text, finish = choice.message.content, choice.finish_reason
    assert text.startswith("{"), text  # the first token already obeys the grammar
    # the grammar ends the output when the document is complete; only max_tokens can cut it short
    assert finish in ("stop", "length")
    assert parses_as_object(text) == (finish == "stop"), (finish, text)


def test_json_schema_output_validates(client, server):
    choice = chat(client, server, response_format=PERSON_FORMAT, max_tokens=MAX_TOKENS, temperature=0).choices[0]
    assert choice.finish_reason == "stop"
    assert_person(choice.message.content)


def test_streamed_json_schema_deltas_make_the_same_valid_document(client, server):
    kwargs = {"response_format": PERSON_FORMAT, "max_tokens": MAX_TOKENS, "temperature": 0}
    text, finishes = streamed_chat(client, server, **kwargs)
    assert finishes[-1] == "stop" and set(finishes[:-1]) <= {None}
    assert len(finishes) > 2  # it did stream
    assert_person(text)
    assert text == chat(client, server, **kwargs).choices[0].message.content  # greedy: the same document


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sampled_json_schema_outputs_validate(client, server, seed: int):
    choice = chat(client, server, response_format=PERSON_FORMAT, max_tokens=MAX_TOKENS, seed=seed).choices[0]
    assert choice.finish_reason == "stop"
    assert_person(choice.message.content)


@pytest.mark.parametrize("where", ["beta", "chat"])
def test_client_parse_with_a_pydantic_model_returns_the_parsed_object(client, server, where: str):
    """`client.beta.chat.completions.parse` (the name the issue and most guides use) and its
    newer home `client.chat.completions.parse` in openai 3.x: both send a strict json_schema."""
    completions = client.beta.chat.completions if where == "beta" else client.chat.completions
    out = completions.parse(
        model=server.model_name, messages=MESSAGES, response_format=Person, max_tokens=MAX_TOKENS, temperature=0
    )
    message = out.choices[0].message
    assert out.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, Person)
    assert message.parsed == Person.model_validate_json(message.content)


def test_response_format_text_is_plain_generation(client, server):
    kwargs = {"max_tokens": 12, "temperature": 0, "extra_body": {"ignore_eos": True}}
    plain = chat(client, server, **kwargs).choices[0].message.content
    assert chat(client, server, response_format={"type": "text"}, **kwargs).choices[0].message.content == plain


def test_completions_take_response_format_too(client, server):
    out = client.completions.create(
        model=server.model_name,
        prompt=PROMPT,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_body={"response_format": PERSON_FORMAT},  # the client's completions() has no such argument
    )
    assert out.choices[0].finish_reason == "stop"
    assert_person(out.choices[0].text)


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}, "if"),
        ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}, "look"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}, "missing"),
        (nested(300), "nested deeper than 64 levels"),  # the body's own depth limit, before the grammar engine
    ],
    ids=["unsupported-keyword", "unsupported-regex", "dangling-ref", "beyond-the-nesting-limit"],
)
def test_a_schema_the_engine_cannot_compile_is_a_400_saying_why(client, server, schema, why: str):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    for stream in (False, True):
        body = bad_request(chat, client, server, response_format=fmt, max_tokens=8, stream=stream)
        assert body["param"].startswith("response_format.json_schema.schema"), body
        assert why in body["message"], body
    assert chat(client, server, max_tokens=2).choices  # still serving


@pytest.mark.parametrize("schema", [["a"], "object", 3], ids=["list", "string", "number"])
def test_a_schema_that_is_not_an_object_is_a_400(client, server, schema):
    fmt = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
    body = bad_request(chat, client, server, response_format=fmt, max_tokens=8)
    assert body["param"] == "response_format.json_schema.schema", body
    assert chat(client, server, response_format=PERSON_FORMAT, max_tokens=MAX_TOKENS, temperature=0).choices


# -- n -----------------------------------------------------------------------------------
def test_n_gives_n_choices_reproducibly_with_a_seed(client, server):
    kwargs = {"n": 3, "max_tokens": 8, "seed": 7, "temperature": 1, "extra_body": {"ignore_eos": True}}
    first = chat(client, server, **kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert all(c.finish_reason == "length" for c in first.choices)
    assert first.usage.completion_tokens == 3 * 8
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert len(set(texts)) == 3, texts  # each choice samples with its own seed (seed + index)
    again = chat(client, server, **kwargs)
    assert [c.message.content for c in sorted(again.choices, key=lambda c: c.index)] == texts


def test_streamed_n_chunks_carry_their_index_and_each_choice_ends_once(client, server):
    kwargs = {"n": 3, "max_tokens": 8, "seed": 7, "temperature": 1, "extra_body": {"ignore_eos": True}}
    chunks = list(chat(client, server, stream=True, stream_options={"include_usage": True}, **kwargs))
    texts: dict[int, str] = {}
    finishes: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason is not None:
                finishes.setdefault(choice.index, []).append(choice.finish_reason)
    assert sorted(texts) == [0, 1, 2]
    assert finishes == {0: ["length"], 1: ["length"], 2: ["length"]}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3 * 8
    whole = chat(client, server, **kwargs)
    assert {c.index: c.message.content for c in whole.choices} == texts  # the same seeds


def test_n_on_completions(client, server):
    out = client.completions.create(
        model=server.model_name, prompt=PROMPT, n=2, max_tokens=6, seed=3, extra_body={"ignore_eos": True}
    )
    assert sorted(c.index for c in out.choices) == [0, 1] and out.usage.completion_tokens == 12


def test_n_above_the_limit_is_a_400(client, server):
    assert bad_request(chat, client, server, n=9, max_tokens=2)["param"] == "n"


# -- logit_bias ----------------------------------------------------------------------------
def test_logit_bias_bans_the_greedy_token_and_forces_another(client, server, token_ids):
    free, _ = completion_tokens(client, server, max_tokens=12, extra_body={"ignore_eos": True})
    banned = free[0]
    assert banned in token_ids, f"{banned!r} is not one token's text"
    bias = {str(token_ids[banned]): -100}
    tokens, _ = completion_tokens(client, server, max_tokens=12, logit_bias=bias, extra_body={"ignore_eos": True})
    assert len(tokens) == 12 and banned not in tokens, (banned, tokens)
    # +100 forces a token the model would not pick: the output is that token, repeated
    forced = next(t for t in sorted(token_ids) if t.strip().isalpha() and len(t) > 2 and t not in free)
    bias = {str(token_ids[forced]): 100}
    tokens, choice = completion_tokens(client, server, max_tokens=6, logit_bias=bias)
    assert tokens == [forced] * 6 and choice.text == forced * 6 and choice.finish_reason == "length"


def test_logit_bias_outside_the_vocabulary_is_a_400(client, server):
    body = bad_request(chat, client, server, max_tokens=2, logit_bias={"10000000": 5})
    assert body["param"] == "logit_bias", body


# -- penalties -----------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
def test_penalties_change_the_greedy_text(client, server, field: str):
    kwargs = {"max_tokens": 48, "extra_body": {"ignore_eos": True}}
    free, plain = completion_tokens(client, server, **kwargs)
    assert len(set(free)) < len(free), "the greedy text repeats no token: a penalty could not change it"
    tokens, penalized = completion_tokens(client, server, **{field: 2.0}, **kwargs)
    assert penalized.text != plain.text
    # the penalty lowers only tokens already generated: up to the first repeat the text is the same
    first_repeat = next(i for i, t in enumerate(free) if t in free[:i])
    assert tokens[:first_repeat] == free[:first_repeat]


def test_a_penalty_out_of_range_is_a_400(client, server):
    assert bad_request(chat, client, server, max_tokens=2, presence_penalty=2.5)["param"] == "presence_penalty"


# -- min_tokens and stop_token_ids -----------------------------------------------------------
def test_min_tokens_holds_back_a_stop_token_the_model_emits_first(client, server, token_ids):
    """The model 'ends early': the token it emits first greedily is made a stop token."""
    (first,), _ = completion_tokens(client, server, max_tokens=1)
    stop_id = token_ids[first]
    _, ended = completion_tokens(client, server, max_tokens=10, extra_body={"stop_token_ids": [stop_id]})
    assert ended.finish_reason == "stop"
    out = client.completions.create(
        model=server.model_name, prompt=PROMPT, max_tokens=10, temperature=0, extra_body={"stop_token_ids": [stop_id]}
    )
    assert out.usage.completion_tokens == 1 and out.choices[0].finish_reason == "stop"
    held = client.completions.create(
        model=server.model_name,
        prompt=PROMPT,
        max_tokens=10,
        temperature=0,
        extra_body={"stop_token_ids": [stop_id], "min_tokens": 5},
    )
    assert held.usage.completion_tokens >= 5


def test_min_tokens_holds_back_eos(client, server):
    """The tiny model's fixed random weights emit EOS two tokens into this prompt (greedy)."""
    prompt = "Today the weather is"
    early = client.completions.create(model=server.model_name, prompt=prompt, max_tokens=20, temperature=0)
    assert early.choices[0].finish_reason == "stop" and early.usage.completion_tokens < 8
    held = client.completions.create(
        model=server.model_name, prompt=prompt, max_tokens=20, temperature=0, extra_body={"min_tokens": 8}
    )
    assert held.usage.completion_tokens >= 8
    assert held.choices[0].text.startswith(early.choices[0].text)


def test_max_completion_tokens_limits_the_output(client, server):
    out = chat(client, server, max_completion_tokens=5, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 5 and out.choices[0].finish_reason == "length"


def test_vllm_sampling_extensions_are_accepted(client, server):
    out = chat(client, server, max_tokens=4, seed=1, extra_body={"top_k": 5, "repetition_penalty": 1.3})
    assert out.choices[0].finish_reason in ("stop", "length")


# -- stop strings ------------------------------------------------------------------------------
def test_up_to_16_stop_strings_and_17_is_a_400(client, server):
    stops = [f"zq{i}x" for i in range(17)]
    out = chat(client, server, max_tokens=4, stop=stops[:16])
    assert out.choices[0].finish_reason in ("stop", "length")
    body = bad_request(chat, client, server, max_tokens=4, stop=stops)
    assert body["param"] == "stop" and "16" in body["message"], body


# -- known but unsupported fields vs unknown ones -------------------------------------------
@pytest.mark.parametrize(
    ("route", "field", "value"),
    [
        ("completions", "best_of", 2),
        ("completions", "suffix", "x"),
        ("chat", "audio", {"voice": "alloy", "format": "wav"}),
        ("chat", "modalities", ["text", "audio"]),
    ],
)
def test_known_unsupported_fields_are_a_400_naming_them(client, server, route: str, field: str, value):
    if route == "chat":
        body = bad_request(chat, client, server, max_tokens=2, extra_body={field: value})
    else:
        create = client.completions.create
        body = bad_request(create, model=server.model_name, prompt=PROMPT, max_tokens=2, **{field: value})
    assert body["param"] == field and field in body["message"], body


def test_an_unknown_field_is_ignored(client, server):
    out = chat(client, server, max_tokens=2, extra_body={"foo_bar": {"x": 1}})
    assert out.choices[0].finish_reason in ("stop", "length")


# -- streams behind proxies ----------------------------------------------------------------------
@pytest.mark.parametrize("route", ["chat/completions", "completions"])
def test_streams_tell_proxies_not_to_buffer(server, openai_base_url: str, route: str):
    body: dict[str, Any] = {"model": server.model_name, "max_tokens": 3, "stream": True}
    body |= {"messages": MESSAGES} if route.startswith("chat") else {"prompt": PROMPT}
    url = f"{openai_base_url}/{route}"
    with httpx.stream("POST", url, json=body, headers=server.headers, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers.get("x-accel-buffering") == "no"
        # TorchServe adds its own directives to the handler's (`no-cache; no-store, must-revalidate, private`)
        directives = {d.strip() for d in re.split(r"[;,]", response.headers.get("cache-control", ""))}
        assert "no-cache" in directives, response.headers.get("cache-control")
        response.read()
