"""Requests that carry no url_path (TorchServe 0.11, /invocations): the body's shape picks OpenAI or native."""

from __future__ import annotations

import json

from tests.support.sse import DONE, reply_events

NO_PATH = ""


def test_a_completions_body_without_url_path_is_answered_as_openai(call):
    body = {"model": "m", "prompt": "Today the weather is", "max_tokens": 6, "stream": True, "ignore_eos": True}
    (reply,) = call((NO_PATH, body))
    assert reply.status == 200 and reply.content_type == "text/event-stream"
    events = reply_events(reply)
    assert events[-1] == DONE
    assert events[0]["object"] == "text_completion"
    assert events[-2]["choices"][0]["finish_reason"] == "length"


def test_a_chat_body_without_url_path_is_answered_as_chat(call):
    body = {"model": "m", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 5, "ignore_eos": True}
    (reply,) = call((NO_PATH, body))
    assert reply.status == 200 and reply.content_type == "application/json"
    result = json.loads(reply.final)
    assert result["object"] == "chat.completion"
    assert result["choices"][0]["message"]["role"] == "assistant"
    assert result["usage"]["completion_tokens"] == 5


def test_a_native_body_without_url_path_stays_native(call):
    (reply,) = call((NO_PATH, {"prompt": "Today the weather is", "max_new_tokens": 4, "stream": False}))
    assert reply.status == 200 and reply.content_type == "application/json"
    assert json.loads(reply.final)["usage"]["completion_tokens"] <= 4


def test_an_openai_body_error_without_url_path_has_the_openai_shape(call):
    (reply,) = call((NO_PATH, {"model": "m", "prompt": "x", "max_tokens": -1}))
    assert reply.status == 400
    error = json.loads(reply.final)["error"]
    assert error["param"] == "max_tokens" and error["type"] == "invalid_request_error"
