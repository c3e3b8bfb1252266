"""The OpenAI routes through the real handler and the tiny model (no Java)."""

from __future__ import annotations

import json

import pytest

from handler.failpoints import ENV_VAR as FAILPOINT_ENV
from tests.support.sse import DONE, reply_events
from tests.support.torchserve_harness import assert_streamed_while_generating, generation_ends

COMPLETIONS = "v1/completions"
CHAT = "v1/chat/completions"


def text_of(events) -> str:
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e["choices"])


def test_streamed_completion_is_sse_with_finish_and_usage(served, call, tiny_tokenizer):
    body = {
        "model": "m",
        "prompt": "Today the weather is",
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    with generation_ends(served[0]) as ends:
        (reply,) = call((COMPLETIONS, body))
    assert reply.status == 200
    assert reply.content_type == "text/event-stream"
    assert_streamed_while_generating(reply, ends[-1])  # events went out while generating
    events = reply_events(reply)
    assert events[-1] == DONE
    usage_event, finish_event = events[-2], events[-3]
    assert usage_event["choices"] == []
    prompt_tokens = len(tiny_tokenizer("Today the weather is")["input_ids"])
    assert usage_event["usage"] == {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 12,
        "total_tokens": 12 + prompt_tokens,
    }
    assert finish_event["choices"][0]["finish_reason"] == "length"
    for event in events[:-3]:
        assert event["object"] == "text_completion" and event["model"] == "m"
        assert event["choices"][0]["finish_reason"] is None and event["usage"] is None
    assert len({e["id"] for e in events[:-1]}) == 1 and events[0]["id"].startswith("cmpl-")


def test_stream_concatenation_equals_non_streamed_text(call):
    body = {"prompt": ["Serving many users"], "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    streamed, whole = call((COMPLETIONS, {**body, "stream": True}), (COMPLETIONS, body))
    assert whole.content_type == "application/json" and not whole.chunks
    result = json.loads(whole.final)
    assert result["object"] == "text_completion"
    assert result["choices"][0]["finish_reason"] == "length"
    assert result["usage"]["completion_tokens"] == 30
    events = reply_events(streamed)
    assert "usage" not in events[0]  # no include_usage: no usage field, no usage chunk
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert text_of(events) == result["choices"][0]["text"]


def test_eos_and_stop_map_to_stop(call):
    # The tiny model's fixed random weights emit EOS two tokens into this prompt (greedy).
    (eos,) = call((COMPLETIONS, {"prompt": "Today the weather is", "max_tokens": 20, "temperature": 0}))
    assert json.loads(eos.final)["choices"][0]["finish_reason"] == "stop"
    free_body = {"prompt": "Streaming sends", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    (free,) = call((COMPLETIONS, free_body))
    text = json.loads(free.final)["choices"][0]["text"]
    (stopped,) = call((COMPLETIONS, {**free_body, "stop": text[5:7]}))
    result = json.loads(stopped.final)["choices"][0]
    assert result["finish_reason"] == "stop" and result["text"] == text[: text.index(text[5:7])]


def test_seeded_sampling_is_reproducible(call):
    body = {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 1.2, "top_p": 0.9, "seed": 3}
    first, second = call((COMPLETIONS, body), (COMPLETIONS, body))
    (other,) = call((COMPLETIONS, {**body, "seed": 4}))
    texts = [json.loads(r.final)["choices"][0]["text"] for r in (first, second, other)]
    assert texts[0] == texts[1] != texts[2]


def test_chat_stream_renders_messages_with_a_default_template(call, tiny_tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
    body = {"messages": messages, "max_completion_tokens": 10, "stream": True, "ignore_eos": True}
    body["stream_options"] = {"include_usage": True}
    (reply,) = call((CHAT, body))
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    events = reply_events(reply)
    assert events[-1] == DONE
    assert events[0]["object"] == "chat.completion.chunk" and events[0]["id"].startswith("chatcmpl-")
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert all("role" not in e["choices"][0]["delta"] for e in events[1:-2])
    assert events[-3]["choices"][0]["finish_reason"] == "length"
    # tokenizer has no chat template: the default one, BOS included once, no extra BOS added
    prompt = "<s>System: Be brief.\nUser: Hello there\nAssistant:"
    expected = len(tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert events[-2]["usage"]["prompt_tokens"] == expected
    assert events[-2]["usage"]["completion_tokens"] == 10


def test_chat_non_streaming_uses_the_tokenizers_own_template(call, served, tiny_tokenizer, monkeypatch):
    handler, _ = served
    template = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[assistant]"
    monkeypatch.setattr(handler.serving.service.backend.tokenizer, "chat_template", template, raising=False)
    content = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "you"}]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    (reply,) = call((CHAT, body))
    result = json.loads(reply.final)
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["message"]["role"] == "assistant"
    assert result["choices"][0]["finish_reason"] == "length"
    expected = len(tiny_tokenizer("[user]Hi you[assistant]", add_special_tokens=False)["input_ids"])
    assert result["usage"]["prompt_tokens"] == expected


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (COMPLETIONS, {"prompt": "x", "n": 9}, "n"),
        (COMPLETIONS, {"prompt": ["a", "b"]}, "prompt"),
        (COMPLETIONS, {"prompt": [1, 2, 10**6]}, "prompt"),  # a token id outside the vocabulary
        (COMPLETIONS, {"prompt": [[1, 2], [3]]}, "prompt"),
        (COMPLETIONS, {"max_tokens": 3}, "prompt"),
        (COMPLETIONS, {"prompt": "x", "max_tokens": 0}, "max_tokens"),
        (COMPLETIONS, {"prompt": "x", "temperature": 3}, "temperature"),
        (COMPLETIONS, {"prompt": "x", "stop": [str(i) for i in range(17)]}, "stop"),
        (COMPLETIONS, {"prompt": "word " * 100}, "prompt"),
        (COMPLETIONS, {"prompt": "word " * 60, "max_tokens": 100}, "max_tokens"),
        (COMPLETIONS, "just text", "body"),
        (CHAT, {"messages": []}, "messages"),
        (CHAT, {"messages": [{"content": "no role"}]}, "messages.0.role"),
        (
            CHAT,
            {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 1000},
            "max_completion_tokens",
        ),
    ],
)
def test_bad_requests_get_openai_errors_with_400(call, route, body, param):
    (reply,) = call((route, body))
    assert reply.status == 400, reply.final
    assert reply.content_type == "application/json"
    error = json.loads(reply.final)["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert set(error) == {"message", "type", "param", "code"}


def test_unknown_fields_are_ignored(call):
    body = {"prompt": "x", "max_tokens": 2, "user": "me", "logit_bias": {}, "presence_penalty": 0.5}
    (reply,) = call((COMPLETIONS, body))
    assert reply.status == 200


def test_bad_request_fails_alone_in_its_batch(call):
    good = {"prompt": "Once upon a time", "max_tokens": 5, "stream": True}
    bad, ok, native = call((COMPLETIONS, {"prompt": "x", "n": 9}), (COMPLETIONS, good), ("", {"prompt": "hi"}))
    assert (bad.status, ok.status, native.status) == (400, 200, 200)
    assert reply_events(ok)[-1] == DONE
    assert native.content_type == "application/x-ndjson"


def test_failure_after_first_chunk_is_an_in_band_error_event(served, call, monkeypatch):
    monkeypatch.setenv(FAILPOINT_ENV, "FAIL-HERE")
    body = {"prompt": "FAIL-HERE now", "max_tokens": 30, "stream": True, "ignore_eos": True}
    with generation_ends(served[0]) as ends:
        (reply,) = call((COMPLETIONS, body))
    assert reply.status == 200
    assert_streamed_while_generating(reply, ends[-1])  # the error came after text had gone out
    events = reply_events(reply)
    assert events[-1] == DONE
    error = events[-2]["error"]
    assert error["type"] == "server_error" and "injected failure" in error["message"]
    (after,) = call((COMPLETIONS, {"prompt": "still here?", "max_tokens": 3}))
    assert after.status == 200


def test_models_are_listed_without_generating(call):
    listing, one, missing = call(("v1/models", None), ("v1/models/m", None), ("v1/models/other", None))
    assert listing.status == 200 and listing.content_type == "application/json"
    assert json.loads(listing.final) == {
        "object": "list",
        "data": [{"id": "m", "object": "model", "created": 0, "owned_by": "inf2-llm-serving"}],
    }
    assert json.loads(one.final)["id"] == "m"
    assert missing.status == 404 and json.loads(missing.final)["error"]["param"] == "model"


def test_unknown_route_is_404(call):
    (reply,) = call(("v1/audio/speech", {"input": "x"}))
    assert reply.status == 404
    assert json.loads(reply.final)["error"]["param"] == "url_path"


def test_embeddings_on_the_llm_archive_are_a_400_that_names_the_embedding_archive(call):
    route, body_shape, good = call(
        ("v1/embeddings", {"input": "x", "model": "m"}),
        ("", {"input": ["x", "y"], "model": "m"}),
        ("v1/completions", {"model": "m", "prompt": "x", "max_tokens": 2}),
    )
    for reply, param in ((route, "url_path"), (body_shape, "input")):
        error = json.loads(reply.final)["error"]
        assert reply.status == 400 and error["param"] == param
        assert "serves text generation" in error["message"] and "handler.task: embed" in error["message"]
    assert good.status == 200  # a batch-mate of both


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("name", ["gpt-4", "../../etc/passwd"])
def test_a_model_this_server_does_not_serve_is_a_404_model_not_found(call, route, name):
    """Issue 42, item 5: OpenAI's and vLLM's answer, on TorchServe's named routes (the served model
    here is "m"); a batch-mate naming the served model is answered as usual."""
    body = (
        {"prompt": "hi", "max_tokens": 2} if route == COMPLETIONS else {"messages": [{"role": "user", "content": "hi"}]}
    )
    unknown, served = call((route, {**body, "model": name}), (route, {**body, "model": "m", "max_tokens": 2}))
    assert unknown.status == 404
    error = json.loads(unknown.final)["error"]
    assert (error["code"], error["param"], error["type"]) == ("model_not_found", "model", "not_found_error")
    assert name in error["message"] and "'m'" in error["message"]
    assert served.status == 200 and json.loads(served.final)["model"] == "m"
