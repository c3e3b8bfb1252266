"""A request names its LoRA adapter: OpenAI's `model` (vLLM's convention), the native `adapter`,
TGI's `parameters.adapter_id`; the model listing names each adapter with its parent."""

from __future__ import annotations

import json

import pytest

from handler.api.native import parse_request
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.tgi import TgiApi
from handler.errors import InvalidRequest, ModelNotFound, NotFound
from handler.request import Limits

LIMITS = Limits(16, 64, adapters=frozenset({"sql", "chat-v2"}))


def test_openai_model_names_an_adapter_the_base_name_means_the_base(tiny_tokenizer):
    api = CompletionsApi("llama", named_route=True)
    request = api.parse({"model": "sql", "prompt": "hi"}, LIMITS)
    assert (request.adapter, api.model) == ("sql", "sql")  # the response names the adapter, as vLLM's
    api = ChatCompletionsApi("llama", named_route=True)
    request = api.parse({"model": "llama", "messages": [{"role": "user", "content": "hi"}]}, LIMITS, tiny_tokenizer)
    assert (request.adapter, api.model) == (None, "llama")


def test_openai_an_unknown_model_is_still_a_404_on_a_named_route():
    with pytest.raises(ModelNotFound) as refused:
        CompletionsApi("llama", named_route=True).parse({"model": "gpt-4", "prompt": "hi"}, LIMITS)
    assert refused.value.param == "model"


def test_native_adapter_field_and_an_unknown_one_is_a_400_naming_it():
    assert parse_request({"prompt": "hi", "adapter": "chat-v2"}, LIMITS).adapter == "chat-v2"
    assert parse_request({"inputs": "hi", "parameters": {"adapter": "sql"}}, LIMITS).adapter == "sql"
    with pytest.raises(InvalidRequest) as refused:
        parse_request({"prompt": "hi", "adapter": "nope"}, LIMITS)
    assert refused.value.param == "adapter" and "chat-v2, sql" in refused.value.message


def test_tgi_adapter_id():
    request = TgiApi().parse({"inputs": "hi", "parameters": {"adapter_id": "sql"}}, LIMITS)
    assert request.adapter == "sql"
    with pytest.raises(InvalidRequest) as refused:
        TgiApi().parse({"inputs": "hi", "parameters": {"adapter_id": "nope"}}, LIMITS)
    assert refused.value.param == "adapter_id"


def test_the_model_listing_names_each_adapter_with_its_parent():
    listing = json.loads(ModelsApi("llama").immediate(LIMITS) or "")
    assert [(m["id"], m.get("parent")) for m in listing["data"]] == [
        ("llama", None),
        ("chat-v2", "llama"),
        ("sql", "llama"),
    ]
    assert json.loads(ModelsApi("llama", "sql").immediate(LIMITS) or "")["parent"] == "llama"
    with pytest.raises(NotFound):
        ModelsApi("llama", "nope").immediate(LIMITS)
