"""The embedding routes' wire format (handler/api/embeddings.py, embedding_schemas.py) and the routing
of both archives: every bad input is a 400 naming its field, base64 decodes as OpenAI's client does."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest

from handler.api import select_api, select_embedding_api
from handler.api.embedding_schemas import parse_inputs
from handler.api.embeddings import FeatureExtractionApi, OpenAIEmbeddingsApi, base64_float32
from handler.api.openai import ModelsApi
from handler.errors import InvalidRequest, NotFound

DIM = 4


@pytest.mark.parametrize(
    ("value", "inputs", "single"),
    [
        ("a text", ("a text",), True),
        (["one", "two"], ("one", "two"), False),
        ([5, 6, 7], ((5, 6, 7),), True),
        ([[5, 6], [7]], ((5, 6), (7,)), False),
    ],
)
def test_the_four_input_shapes(value, inputs, single):
    assert parse_inputs(value, "input", 8) == (inputs, single)


@pytest.mark.parametrize(
    ("value", "param", "words"),
    [
        ("", "input", "empty"),
        ("   ", "input", "empty"),
        ([], "input", "empty list"),
        (["ok", ""], "input[1]", "empty"),
        (["ok", 3], "input[1]", "must be a string"),
        (["ok", None], "input[1]", "null"),
        ([1, "a"], "input[1]", "must be a token id"),
        ([1, True], "input[1]", "must be a token id"),
        ([[1], []], "input[1]", "empty list of token ids"),
        ([[1], [2, "x"]], "input[1][1]", "must be a token id"),
        ([[1], "x"], "input[1]", "list of token ids"),
        ({"text": "x"}, "input", "a JSON object"),
        (3.5, "input", "a JSON number"),
        (["a", "b", "c"], "input", "at most 2 per request"),
    ],
)
def test_bad_inputs_are_a_400_naming_the_input(value, param, words):
    with pytest.raises(InvalidRequest) as caught:
        parse_inputs(value, "input", 2)
    assert caught.value.param == param and words in caught.value.message


def test_openai_body_fields():
    api = OpenAIEmbeddingsApi("served", DIM)
    request = api.parse({"input": ["a", "b"], "model": "asked", "encoding_format": "base64", "user": "u"}, 8)
    assert (request.inputs, request.encoding_format, api.model) == (("a", "b"), "base64", "asked")
    assert api.parse({"input": "a", "dimensions": DIM}, 8).dimensions == DIM


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"input": "a", "dimensions": DIM - 1}, "dimensions", "cannot be shortened"),
        ({"input": "a", "dimensions": 0}, "dimensions", "greater than or equal to 1"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "float"),
        ({"model": "m"}, "input", "required"),
        ({"input": "a", "max_tokens": 5}, "max_tokens", "handler.task: generate"),
        ({"input": "a", "stream": True}, "stream", "text-generation field"),
        ({"input": "a", "temperature": 0}, "temperature", "serves embeddings"),
    ],
)
def test_openai_body_errors_name_the_field(body, param, words):
    with pytest.raises(InvalidRequest) as caught:
        OpenAIEmbeddingsApi("m", DIM).parse(body, 8)
    assert caught.value.param == param and words in caught.value.message


def test_openai_reply_float_and_base64_decode_to_the_same_vectors():
    vectors = np.array([[0.5, -1.25, 3.0e-8, 7.0], [1.0, 2.0, 3.0, -4.5]], dtype=np.float32)
    api = OpenAIEmbeddingsApi("m", DIM)
    floats = json.loads(api.reply(api.parse({"input": ["a", "b"]}, 8), vectors, 9))
    assert floats["object"] == "list" and floats["model"] == "m"
    assert floats["usage"] == {"prompt_tokens": 9, "total_tokens": 9}
    assert [d["index"] for d in floats["data"]] == [0, 1] and {d["object"] for d in floats["data"]} == {"embedding"}
    assert np.array_equal(np.array([d["embedding"] for d in floats["data"]], dtype=np.float32), vectors)
    encoded = json.loads(api.reply(api.parse({"input": ["a", "b"], "encoding_format": "base64"}, 8), vectors, 9))
    # How the openai client decodes it (openai/resources/embeddings.py): numpy float32 from the base64 bytes.
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="float32") for d in encoded["data"]]
    assert np.array_equal(np.stack(decoded), vectors)


def test_base64_is_little_endian_float32():
    raw = base64.b64decode(base64_float32(np.array([1.0, -2.0], dtype=np.float64)))
    assert raw == np.array([1.0, -2.0], dtype="<f4").tobytes() and len(raw) == 8


def test_feature_extraction_answers_a_list_of_vectors():
    api = FeatureExtractionApi()
    request = api.parse({"inputs": ["a", "b"], "parameters": {"truncate": False}}, 8)
    assert request.inputs == ("a", "b") and request.input_param(1) == "inputs[1]"
    vectors = np.array([[1.0, 2.0], [3.0, 4.0]], dtype=np.float32)
    assert json.loads(api.reply(request, vectors, 4)) == [[1.0, 2.0], [3.0, 4.0]]
    assert api.parse("plain text", 8).inputs == ("plain text",)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"inputs": "a", "parameters": {"max_new_tokens": 3}}, "parameters.max_new_tokens"),
        ({"inputs": "a", "parameters": "x"}, "parameters"),
        ({"inputs": []}, "inputs"),
        ({"inputs": ["a", 1]}, "inputs[1]"),
    ],
)
def test_feature_extraction_errors_name_the_field(body, param):
    with pytest.raises(InvalidRequest) as caught:
        FeatureExtractionApi().parse(body, 8)
    assert caught.value.param == param


@pytest.mark.parametrize(
    ("url_path", "body", "kind"),
    [
        ("v1/embeddings", None, OpenAIEmbeddingsApi),
        ("/v1/embeddings/", None, OpenAIEmbeddingsApi),
        ("v1/models", None, ModelsApi),
        ("v1/models/m", None, ModelsApi),
        (None, {"input": "a", "model": "m"}, OpenAIEmbeddingsApi),
        (None, {"input": "a"}, OpenAIEmbeddingsApi),
        (None, {"inputs": "a"}, FeatureExtractionApi),
        ("", "plain text", FeatureExtractionApi),
    ],
)
def test_embedding_archive_routes(url_path, body, kind):
    assert isinstance(select_embedding_api(url_path, "m", DIM, body), kind)


@pytest.mark.parametrize(
    ("url_path", "body", "param"),
    [
        ("v1/chat/completions", None, "url_path"),
        ("v1/completions", None, "url_path"),
        ("generate", None, "url_path"),
        ("generate_stream", None, "url_path"),
        (None, {"messages": [{"role": "user", "content": "hi"}]}, "messages"),
        (None, {"prompt": "hi", "max_new_tokens": 3}, "max_new_tokens"),
        (None, {"text": "hi"}, "input"),
    ],
)
def test_the_embedding_archive_refuses_generation_and_says_which_archive_generates(url_path, body, param):
    with pytest.raises(InvalidRequest) as caught:
        select_embedding_api(url_path, "m", DIM, body)
    assert caught.value.param == param and caught.value.status == 400
    if param != "input":
        assert "handler.task: generate" in caught.value.message


def test_the_embedding_archive_404s_an_unknown_route():
    with pytest.raises(NotFound):
        select_embedding_api("v1/audio/speech", "m", DIM, None)


@pytest.mark.parametrize(
    ("url_path", "body", "param"),
    [
        ("v1/embeddings", None, "url_path"),
        (None, {"input": "x", "model": "m"}, "input"),
        (None, {"input": ["x"]}, "input"),
    ],
)
def test_the_generation_archive_refuses_embeddings_and_says_which_archive_embeds(url_path, body, param):
    with pytest.raises(InvalidRequest) as caught:
        select_api(url_path, "m", body)
    assert caught.value.param == param and "handler.task: embed" in caught.value.message


def test_the_generation_archive_still_serves_its_own_bodies_that_mention_input():
    assert select_api(None, "m", {"prompt": "x", "input": "ignored"}).name == "native"
