"""The TGI wire format (handler/api/tgi.py): parsing TGI bodies, rendering events and bodies, errors."""

from __future__ import annotations

import json
from typing import Any

import pytest

from handler.api.tgi import TgiApi
from handler.engine.sequence import FinishReason, Sequence
from handler.errors import EngineError, InvalidRequest, ServiceUnavailable
from handler.request import Constraint, Limits, PromptTokenLogprob, TokenChoice

LIMITS = Limits(default_max_new_tokens=16, max_new_tokens=100)
EOS = 0
VOCAB = {0: "</s>", 1: "<s>", 2: "a", 3: "b", 4: " c", 5: "x", 6: "y", 7: "q"}


class CharTokenizer:
    """One piece of text per id; special ids dropped when asked, like transformers' decode."""

    all_special_ids = (0, 1)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return "".join(VOCAB[i] for i in ids if not (skip_special_tokens and i in self.all_special_ids))


def parse(params: dict[str, Any] | None = None, route: TgiApi | None = None, **body: Any):
    api = route or TgiApi()
    request = api.parse({"inputs": "ab", "parameters": params or {}, **body}, LIMITS)
    return api, request


def generate(api: TgiApi, request, tokens: list[TokenChoice], prompt_logprobs=()) -> tuple[Sequence, list[str]]:
    """Feed the tokens one step at a time; return the sequence and what each step put on the wire."""
    seq = Sequence(request, [1, 2, 3], CharTokenizer(), frozenset({EOS}), "r")
    if prompt_logprobs:
        tokens = [TokenChoice(tokens[0].token_id, tokens[0].logprob, tokens[0].top_logprobs, prompt_logprobs)]
        tokens += tokens[1:]
    wire = []
    for choice in tokens:
        delta = seq.take(choice)
        out = api.chunk(seq, delta) if delta and request.stream else ""
        if seq.finished:
            out += api.final(seq)
        wire.append(out)
        if seq.finished:
            break
    return seq, wire


def events(wire: list[str]) -> list[dict[str, Any]]:
    text = "".join(wire)
    assert not text or text.endswith("\n\n")
    return [json.loads(block.removeprefix("data:")) for block in text.split("\n\n") if block]


def choice(token_id: int, logprob: float = -0.5, top: tuple[tuple[int, float], ...] = ()) -> TokenChoice:
    return TokenChoice(token_id, logprob, top)


# -- parsing -------------------------------------------------------------------
def test_greedy_unless_do_sample_or_a_warper_asks():
    assert not parse()[1].sampling.do_sample
    assert not parse({"temperature": 1.0, "seed": 3})[1].sampling.do_sample  # neutral values stay greedy
    assert parse({"do_sample": True})[1].sampling.do_sample
    assert parse({"temperature": 0.7})[1].sampling.do_sample
    assert parse({"top_k": 5})[1].sampling.do_sample
    assert parse({"top_p": 0.9})[1].sampling.do_sample


def test_a_sampled_request_without_a_seed_gets_one_and_reports_it():
    api, request = parse({"do_sample": True, "details": True})
    assert request.sampling.seed is not None and api.seed == request.sampling.seed
    api, request = parse({"details": True, "seed": 7})
    assert api.seed is None  # greedy: TGI reports no seed


def test_fields_map_onto_the_generation_request():
    params = {"max_new_tokens": 5, "stop": ["\n"], "repetition_penalty": 1.2, "top_n_tokens": 3, "ignore_eos": True}
    _api, request = parse(params, stream=True)
    assert request.max_new_tokens == 5 and request.stop == ("\n",) and request.ignore_eos
    assert request.sampling.repetition_penalty == 1.2 and request.stream
    assert request.logprobs == 3 and not request.prompt_logprobs


@pytest.mark.parametrize(
    ("params", "expected"),
    [({}, None), ({"details": True}, 0), ({"top_n_tokens": 2}, 2), ({"decoder_input_details": True}, 0)],
)
def test_logprobs_are_asked_for_when_the_answer_shows_them(params, expected):
    assert parse(params)[1].logprobs == expected


def test_a_plain_stream_asks_for_no_logprobs_and_generate_stream_always_streams():
    assert parse(stream=True)[1].logprobs is None
    assert parse({"details": True}, stream=True)[1].logprobs == 0
    _api, request = parse(route=TgiApi(always_stream=True), stream=False)
    assert request.stream


def test_decoder_input_details_asks_for_prompt_logprobs():
    assert parse({"details": True, "decoder_input_details": True})[1].prompt_logprobs


@pytest.mark.parametrize(
    ("params", "body", "message"),
    [
        ({"temperature": 0}, {}, "`temperature` must be strictly positive"),
        ({"repetition_penalty": 0}, {}, "`repetition_penalty` must be strictly positive"),
        ({"top_k": 0}, {}, "`top_k` must be strictly positive"),
        ({"top_p": 1.0}, {}, "`top_p` must be > 0.0 and < 1.0"),
        ({"max_new_tokens": 0}, {}, "`max_new_tokens` must be strictly positive"),
        ({"max_new_tokens": 101}, {}, "`max_new_tokens` must be <= 100"),
        ({"stop": [str(i) for i in range(17)]}, {}, "up to 16 stop sequences"),
        ({"top_n_tokens": 6}, {}, "`top_n_tokens` must be >= 0 and <= 5"),
        ({"watermark": True}, {}, "`watermark` is not supported"),
        ({"best_of": 2}, {}, "`best_of` is not supported"),
        ({"truncate": 10}, {}, "`truncate` is not supported"),
        ({"typical_p": 0.5}, {}, "`typical_p` is not supported"),
        ({"grammar": {"type": "yaml", "value": {}}}, {}, "grammar.type must be json, json_schema or regex"),
        ({"grammar": {"type": "json", "value": [1]}}, {}, "grammar must be a JSON Schema object"),
        ({"grammar": {"type": "regex", "value": ""}}, {}, "grammar.value must be a non-empty regular expression"),
        ({"grammar": "json"}, {}, "grammar must be an object"),
        ({"frequency_penalty": 2.5}, {}, "frequency_penalty must be between -2 and 2"),
        ({"adapter_id": "x"}, {}, "the adapter 'x' is not served here (adapters: none)"),
        ({"decoder_input_details": True}, {"stream": True}, "not supported when streaming"),
        ({"temperature": "hot"}, {}, "`temperature`"),
        ({}, {"inputs": " "}, "`inputs` cannot be empty"),
    ],
)
def test_invalid_or_unsupported_parameters_are_refused(params, body, message):
    with pytest.raises(InvalidRequest) as exc:
        TgiApi().parse({"inputs": "ab", "parameters": params, **body}, LIMITS)
    assert message in exc.value.message


def test_neutral_values_of_unsupported_knobs_are_accepted():
    # huggingface_hub sends only non-None values, but older clients send these defaults
    neutral = {"watermark": False, "best_of": 1, "frequency_penalty": 0, "details": False}
    api, request = parse(neutral)
    _, plain = parse({})
    assert request == plain  # accepted and changes nothing: the same request as without them
    assert api.details is False
    with pytest.raises(InvalidRequest):  # while a non-neutral value of the same knob is refused
        parse({**neutral, "best_of": 2})


@pytest.mark.parametrize(
    ("grammar", "constraint"),
    [
        ({"type": "regex", "value": "[0-9]{3}"}, Constraint("regex", "[0-9]{3}")),
        (
            {"type": "json", "value": {"type": "object", "required": ["a"]}},
            Constraint("json_schema", '{"type":"object","required":["a"]}'),
        ),
        ({"type": "json", "value": '{"type": "object"}'}, Constraint("json_schema", '{"type":"object"}')),
        (
            {"type": "json_schema", "value": {"name": "x", "schema": {"type": "array"}}},
            Constraint("json_schema", '{"type":"array"}'),
        ),
    ],
)
def test_grammar_becomes_the_requests_constraint(grammar, constraint):
    api, request = parse({"grammar": grammar, "frequency_penalty": 0.5})
    assert request.constraint == constraint
    assert request.sampling.frequency_penalty == 0.5
    assert api.wire_name("constraint") == "parameters.grammar"


def test_a_missing_inputs_or_a_non_object_body_is_refused():
    with pytest.raises(InvalidRequest, match="`inputs` is required"):
        TgiApi().parse({"parameters": {}}, LIMITS)
    with pytest.raises(InvalidRequest, match="JSON object"):
        TgiApi().parse("plain text", LIMITS)


# -- rendering -----------------------------------------------------------------
def test_non_streamed_without_details_is_just_the_text():
    api, request = parse({"max_new_tokens": 3}, stream=False)
    _seq, wire = generate(api, request, [choice(2), choice(3), choice(4)])
    assert json.loads(wire[-1]) == {"generated_text": "ab c"}
    api, request = parse({"max_new_tokens": 3, "return_full_text": True}, route=TgiApi(as_list=True))
    _seq, wire = generate(api, request, [choice(2), choice(3), choice(4)])
    assert json.loads(wire[-1]) == [{"generated_text": "abab c"}]  # no route: a list, like TGI's POST /


def test_non_streamed_details_list_every_token_with_its_logprob():
    api, request = parse({"details": True, "top_n_tokens": 2})
    tops = ((3, -0.1), (0, -2.0))
    _seq, wire = generate(api, request, [choice(2, -0.25, tops), choice(3, -0.5, tops), choice(EOS, -1.0, tops)])
    details = json.loads(wire[-1])["details"]
    assert details["finish_reason"] == "eos_token" and details["generated_tokens"] == 3 and details["seed"] is None
    assert details["prefill"] == []
    assert details["tokens"] == [
        {"id": 2, "text": "a", "logprob": -0.25, "special": False},
        {"id": 3, "text": "b", "logprob": -0.5, "special": False},
        {"id": EOS, "text": "", "logprob": -1.0, "special": True},
    ]
    assert details["top_tokens"][0] == [
        {"id": 3, "text": "b", "logprob": -0.1, "special": False},
        {"id": 0, "text": "</s>", "logprob": -2.0, "special": True},
    ]


def test_decoder_input_details_list_the_prompt_with_its_logprobs():
    api, request = parse({"details": True, "decoder_input_details": True, "max_new_tokens": 1})
    prompt = (PromptTokenLogprob(1, None), PromptTokenLogprob(2, -3.0), PromptTokenLogprob(3, -1.5))
    _seq, wire = generate(api, request, [choice(4)], prompt_logprobs=prompt)
    assert json.loads(wire[-1])["details"]["prefill"] == [
        {"id": 1, "text": "<s>", "logprob": None},
        {"id": 2, "text": "a", "logprob": -3.0},
        {"id": 3, "text": "b", "logprob": -1.5},
    ]


def test_stream_has_one_event_per_token_and_the_last_carries_the_text_and_details():
    api, request = parse({"details": True, "max_new_tokens": 3}, stream=True)
    _seq, wire = generate(api, request, [choice(2), choice(3), choice(4)])
    got = events(wire)
    assert [e["index"] for e in got] == [1, 2, 3]
    assert [e["token"]["id"] for e in got] == [2, 3, 4]
    assert all(e["generated_text"] is None and e["details"] is None for e in got[:-1])
    assert got[-1]["generated_text"] == "ab c"
    assert got[-1]["details"] == {"finish_reason": "length", "generated_tokens": 3, "seed": None, "input_length": 3}
    assert all("top_tokens" not in e for e in got)


def test_stream_token_texts_concatenate_to_the_text_when_a_stop_string_holds_text_back():
    api, request = parse({"stop": ["xyz"], "max_new_tokens": 5}, stream=True)
    seq, wire = generate(api, request, [choice(5), choice(6), choice(7), choice(5), choice(6)])
    got = events(wire)
    assert [e["token"]["text"] for e in got] == ["", "", "xyq", "", "xy"]  # "xy" held back, released by "q"
    assert "".join(e["token"]["text"] for e in got) == got[-1]["generated_text"] == seq.full_text == "xyqxy"
    assert wire[0] == wire[1] == ""  # nothing sent while the text is held back


def test_stream_ends_at_a_stop_string_with_stop_sequence():
    api, request = parse({"stop": ["b "], "details": True}, stream=True)
    _seq, wire = generate(api, request, [choice(2), choice(3), choice(4)])
    got = events(wire)
    assert got[-1]["details"]["finish_reason"] == "stop_sequence"
    assert "".join(e["token"]["text"] for e in got) == got[-1]["generated_text"] == "a"


def test_a_chunk_spanning_several_steps_gets_one_event_per_token():
    # continuous mode: the frontend was slow, one reply carries three steps' text
    api, request = parse({"max_new_tokens": 4}, stream=True)
    seq = Sequence(request, [1], CharTokenizer(), frozenset({EOS}), "r")
    deltas = [seq.take(choice(t)) for t in (2, 3, 4)]
    first = events([api.chunk(seq, "".join(deltas))])
    assert [e["token"]["text"] for e in first] == ["a", "b", " c"]
    seq.take(choice(EOS))
    last = events([api.final(seq)])
    assert [e["token"]["special"] for e in last] == [True] and last[0]["generated_text"] == "ab c"


def test_a_chunk_does_not_send_tokens_taken_after_its_text():
    # continuous mode: the engine took another token between the update and the reply
    api, request = parse({"max_new_tokens": 4}, stream=True)
    seq = Sequence(request, [1], CharTokenizer(), frozenset({EOS}), "r")
    delta = seq.take(choice(2))
    seq.take(choice(3))
    assert [e["token"]["text"] for e in events([api.chunk(seq, delta)])] == ["a"]
    assert [e["token"]["text"] for e in events([api.chunk(seq, "b")])] == ["b"]


def test_streamed_top_tokens_are_a_flat_list_per_event():
    api, request = parse({"top_n_tokens": 1, "max_new_tokens": 2}, stream=True)
    _seq, wire = generate(api, request, [choice(2, -0.1, ((2, -0.1),)), choice(3, -0.2, ((3, -0.2),))])
    got = events(wire)
    assert got[0]["top_tokens"] == [{"id": 2, "text": "a", "logprob": -0.1, "special": False}]


def test_a_backend_without_logits_gives_null_logprobs():
    api, request = parse({"details": True, "max_new_tokens": 1})
    _seq, wire = generate(api, request, [TokenChoice(2)])
    assert json.loads(wire[-1])["details"]["tokens"][0]["logprob"] is None


# -- errors --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("error", "status", "error_type"),
    [
        (InvalidRequest("`top_k` must be strictly positive", "top_k"), 422, "validation"),
        (EngineError("generation failed: boom"), 424, "generation"),
        (ServiceUnavailable("draining"), 503, "overloaded"),
    ],
)
def test_errors_have_tgi_shape_and_status(error, status, error_type):
    api = TgiApi()
    assert api.http_status(error)[0] == status
    body = json.loads(api.error(error, midstream=False))
    assert body["error_type"] == error_type and set(body) == {"error", "error_type"}
    if status == 422:
        assert body["error"] == "Input validation error: `top_k` must be strictly positive"


def test_a_midstream_error_is_one_more_event():
    api = TgiApi()
    (event,) = events([api.error(EngineError("boom"), midstream=True)])
    assert event == {"error": "boom", "error_type": "generation"}
    (event,) = events([api.error(ServiceUnavailable("cut at the drain deadline"), midstream=True)])
    assert event["error_type"] == "incomplete_generation"


def test_no_error_message_looks_like_unused_model_kwargs():
    # huggingface_hub drops parameters and refuses to stream after a 400 saying so
    with pytest.raises(InvalidRequest) as exc:
        TgiApi().parse({"inputs": "ab", "parameters": {"watermark": True}}, LIMITS)
    assert "model_kwargs" not in TgiApi().error(exc.value, midstream=False)


def test_finish_reasons_are_tgi_names():
    from handler.api.tgi import FINISH_REASONS

    assert set(FINISH_REASONS) == set(FinishReason)
