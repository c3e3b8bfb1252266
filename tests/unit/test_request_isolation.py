"""No request content can end the worker or reach a 500: text that is not valid Unicode and deep
nesting are that request's 400 naming the field, and every reply the worker writes can be encoded."""

from __future__ import annotations

import json

import pytest

from handler.api.common import decode_body, stop_strings
from handler.api.json_tree import check_json_tree, printable
from handler.errors import InvalidRequest
from handler.request import Limits
from handler.serving.replies import encodable

SURROGATE = "\ud800"


def refused(body, max_depth: int = 64) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as excinfo:
        decode_body(body, max_depth)
    return excinfo.value


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"model": "\\ud800", "prompt": "hi"}', "model"),
        ('{"messages": [{"role": "user", "content": "a\\udfffb"}]}', "messages.1.content".replace("1", "0")),
        ('{"prompt": "hi", "stop": ["ok", "\\ud800"]}', "stop.1"),
        ('{"prompt": "hi", "logit_bias": {"\\ud800": 1}}', "logit_bias.\\ud800"),
        ('{"tools": [{"function": {"name": "\\udc00"}}]}', "tools.0.function.name"),
    ],
)
def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(raw: str, param: str):
    for body in (raw, raw.encode(), json.loads(raw)):  # as TorchServe may hand it over: text, bytes, decoded
        error = refused(body)
        assert error.param == param
        assert "not valid Unicode" in error.message
        printable(error.message).encode("utf-8")  # the message itself can be sent


def test_valid_unicode_passes_whole():
    body = {"prompt": "héllo 世界 😀", "stop": ["。"]}
    assert decode_body(json.dumps(body, ensure_ascii=False)) == body
    assert decode_body(json.dumps(body)) == body


@pytest.mark.parametrize("depth", [65, 2000])
def test_nesting_past_the_limit_is_a_400_not_a_recursion_error(depth: int):
    raw = '{"prompt": "hi", "response_format": ' + "[" * depth + "]" * depth + "}"
    error = refused(raw)
    assert "nested deeper than 64 levels" in error.message
    assert error.param.startswith("response_format") or error.param == "body"


def test_nesting_at_the_limit_is_accepted():
    value: list = []
    for _ in range(62):
        value = [value]
    check_json_tree({"a": value}, 64)  # the body, "a" and 62 lists inside: 64 levels


def test_the_check_has_no_recursion_of_its_own():
    deep: list = []
    for _ in range(5_000):
        deep = [deep]
    check_json_tree({"x": deep}, 10**4)  # deeper than Python's stack, within the limit: no RecursionError
    with pytest.raises(InvalidRequest, match="nested deeper than 64"):
        check_json_tree({"x": deep}, 64)
    # a lone surrogate at the bottom is still found
    bottom: list = [SURROGATE]
    for _ in range(50):
        bottom = [bottom]
    with pytest.raises(InvalidRequest, match="lone surrogate"):
        check_json_tree({"x": bottom}, 64)


def test_every_reply_becomes_encodable():
    replies = [f'{{"error": {{"message": "unknown model {SURROGATE}"}}}}\n', "plain", b"\xff", "é"]
    out = encodable(replies)
    assert out[0] == '{"error": {"message": "unknown model \\ud800"}}\n'
    json.loads(out[0])  # the escape is JSON's own
    assert out[1:] == ["plain", b"\xff", "é"]
    for reply in out:
        if isinstance(reply, str):
            reply.encode("utf-8")


LIMITS = Limits(default_max_new_tokens=8, max_new_tokens=64, max_stop_strings=16, max_stop_chars=4096)


def test_stop_strings_are_bounded_in_count_and_total_length():
    assert stop_strings(["a" * 2048, "b" * 2048], LIMITS) == ("a" * 2048, "b" * 2048)
    with pytest.raises(InvalidRequest, match="4096 characters in all, got 1000000") as excinfo:
        stop_strings("x" * 1_000_000, LIMITS)
    assert excinfo.value.param == "stop"
    with pytest.raises(InvalidRequest, match="at most 16 stop strings"):
        stop_strings(["s"] * 17, LIMITS)


def test_a_byte_order_mark_before_json_is_skipped():
    body = {"prompt": "hi", "max_new_tokens": 3, "stream": False}
    assert decode_body(b"\xef\xbb\xbf" + json.dumps(body).encode()) == body
    assert decode_body("\ufeff" + json.dumps(body)) == body


def test_a_constraint_failure_ends_the_sequence_with_an_error_not_a_stop(tiny_tokenizer):
    from handler.engine.sequence import Sequence, State
    from handler.request import Constraint, GenerationRequest, TokenChoice

    request = GenerationRequest("hi", 8, constraint=Constraint("regex", "[0-9]+"))
    sequence = Sequence(request, [1, 2], tiny_tokenizer, {tiny_tokenizer.eos_token_id}, "r")
    assert sequence.take(TokenChoice(tiny_tokenizer.eos_token_id, constraint_failure="parser gave up")) == ""
    assert sequence.state is State.FAILED
    assert sequence.error.status == 400 and sequence.error.param == "constraint"
    assert "parser gave up" in sequence.error.message


def test_the_grammar_cache_is_bounded_by_bytes_not_entries(monkeypatch):
    from handler.grammar import matchers
    from handler.grammar.byte_lru import ByteLRU
    from handler.grammar.grammars import llguidance_grammar
    from handler.request import Constraint

    monkeypatch.setattr(matchers, "cache", ByteLRU(2_000_000))
    for i in range(20):  # twenty distinct ~200 KB schemas: about 8 MB of texts
        schema = {"type": "string", "enum": [f"{i}-{j}-" + "x" * 40 for j in range(4000)]}
        llguidance_grammar(Constraint("json_schema", json.dumps(schema)))
        assert matchers.cache.bytes <= 2_000_000
    assert 0 < len(matchers.cache) < 20
    huge = ByteLRU(10)
    huge.put("k", "v" * 100, 100)  # larger than the whole budget: not kept
    assert huge.get("k") is None and huge.bytes == 0


def test_a_number_python_will_not_convert_is_a_400():
    error = refused('{"prompt": "hi", "seed": ' + "9" * 5000 + "}")
    assert error.param == "body" and "not valid JSON" in error.message
