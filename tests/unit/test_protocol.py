import json

import pytest

from handler.api.common import decode_body
from handler.api.native import NativeApi, parse_request
from handler.errors import InvalidRequest
from handler.request import Limits

LIMITS = Limits(default_max_new_tokens=16, max_new_tokens=100)


def parse(body):
    return parse_request(decode_body(body), LIMITS)


def rejected(body) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as excinfo:
        parse(body)
    return excinfo.value


def test_native_json_object():
    request = parse({"prompt": "Hi", "max_new_tokens": 5, "temperature": 0.7, "top_k": 3, "stop": "\n", "seed": 1})
    assert request.prompt == "Hi"
    assert request.max_new_tokens == 5
    assert request.sampling.do_sample is True
    assert request.sampling.temperature == 0.7
    assert request.sampling.top_k == 3
    assert request.sampling.seed == 1
    assert request.stop == ("\n",)
    assert request.stream is True


def test_defaults_are_greedy_streaming_with_default_length():
    request = parse({"prompt": "Hi"})
    assert request.sampling.do_sample is False
    assert request.max_new_tokens == 16
    assert request.stream is True


def test_temperature_zero_is_greedy_even_when_sampling_asked():
    assert parse({"prompt": "Hi", "do_sample": True, "temperature": 0}).sampling.do_sample is False


def test_huggingface_form():
    request = parse({"inputs": "Hi", "parameters": {"max_new_tokens": 7, "do_sample": True, "top_p": 0.9}})
    assert (request.prompt, request.max_new_tokens, request.sampling.top_p) == ("Hi", 7, 0.9)
    assert parse({"inputs": "Hi", "stream": False}).stream is False
    assert parse({"inputs": "Hi", "parameters": {"stream": False}}).stream is False


@pytest.mark.parametrize("body", ["Today the weather is", b"Today the weather is", bytearray(b"Today the weather is")])
def test_plain_text_body_is_the_prompt(body):
    assert parse(body).prompt == "Today the weather is"


def test_json_text_bytes_are_parsed_by_content_not_header():
    body = json.dumps({"prompt": "Hi", "max_new_tokens": 3}).encode()
    assert parse(b"  \n" + body).max_new_tokens == 3


def test_unknown_fields_are_ignored():
    assert parse({"prompt": "Hi", "best_of": 2}).prompt == "Hi"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", "body"),
        ("[1, 2", "body"),
        ("[1, 2]", "body"),
        (b"\xff\xfeHi", "body"),
        ({}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": "   "}, "prompt"),
        ({"prompt": 5}, "prompt"),
        ({"inputs": ["a"]}, "inputs"),
        ({"prompt": "Hi", "max_new_tokens": "5"}, "max_new_tokens"),
        ({"prompt": "Hi", "max_new_tokens": True}, "max_new_tokens"),
        ({"prompt": "Hi", "max_new_tokens": 0}, "max_new_tokens"),
        ({"prompt": "Hi", "max_new_tokens": 101}, "max_new_tokens"),
        ({"prompt": "Hi", "temperature": -0.1}, "temperature"),
        ({"prompt": "Hi", "temperature": float("nan")}, "temperature"),
        ({"prompt": "Hi", "temperature": float("inf")}, "temperature"),
        ({"prompt": "Hi", "temperature": "hot"}, "temperature"),
        ({"prompt": "Hi", "top_p": 0}, "top_p"),
        ({"prompt": "Hi", "top_p": 1.5}, "top_p"),
        ({"prompt": "Hi", "top_k": -1}, "top_k"),
        ({"prompt": "Hi", "repetition_penalty": 0}, "repetition_penalty"),
        ({"prompt": "Hi", "stop": [str(i) for i in range(17)]}, "stop"),
        ({"prompt": "Hi", "stop": [""]}, "stop"),
        ({"prompt": "Hi", "stop": ["a", 1]}, "stop"),
        ({"prompt": "Hi", "stream": "yes"}, "stream"),
        ({"prompt": "Hi", "seed": -1}, "seed"),
        ({"inputs": "Hi", "parameters": {"top_k": -1}}, "parameters.top_k"),
    ],
)
def test_bad_requests_name_the_field(body, param):
    error = rejected(body)
    assert error.param == param
    assert error.status == 400
    assert error.message


def test_invalid_json_message_says_so():
    assert "not valid JSON" in rejected(b'{"prompt": ').message
    assert "UTF-8" in rejected(b"\xc3\x28").message


def test_a_400_about_the_prompts_logprobs_names_the_field_the_body_used():
    """`echo` and `prompt_logprobs` are one switch; the service's refusal names whichever was sent."""
    cases = [
        ({"prompt": "x", "echo": True}, "echo"),
        ({"prompt": "x", "prompt_logprobs": True}, "prompt_logprobs"),
        ({"inputs": "x", "parameters": {"prompt_logprobs": True}}, "prompt_logprobs"),
    ]
    for body, field in cases:
        api = NativeApi()
        assert api.parse(body, LIMITS).prompt_logprobs is True
        assert api.wire_name("prompt_logprobs") == field
        assert api.wire_name("max_new_tokens") == "max_new_tokens"
