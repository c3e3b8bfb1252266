"""Streamed text equals the non-streamed text on the real byte-level tokenizer (SmolLM2's BPE
splits accented letters, CJK and emoji across tokens), on the native route and the OpenAI chat
route: the streaming detokenizer holds back half characters and never emits U+FFFD."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from tests.support.streaming import assert_first_arrived_while_generating, timed

# Greedy, this prompt makes the model write CJK and emoji (a numbered list of Chinese phrases ending in 🍣)
# for its whole budget; 120 tokens end on a whole character, so the text holds no U+FFFD.
MESSAGES = [
    {
        "role": "user",
        "content": "Write a sentence for each of these words, and quote the word in each sentence: "
        "café, naïve, 東京, 🍣, 🚀",
    }
]
MAX_TOKENS = 120
BATCH_DELAY_S = 0.001  # REAL_MODEL_CONFIG's maxBatchDelay (1 ms)


def beyond_latin(text: str) -> set[str]:
    """The characters of `text` outside Latin-1 and its extensions (CJK, emoji, ...)."""
    return {ch for ch in text if ord(ch) > 0x2000}


def native_stream(server, body: dict[str, Any]) -> tuple[float, list[tuple[float, dict[str, Any]]]]:
    """POST to the native route and read the NDJSON lines as they arrive: (sent at, [(arrived at, line)])."""
    started = time.perf_counter()
    with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=300) as response:
        assert response.status_code == 200, response.read()
        lines = [(at, json.loads(line)) for at, line in timed(response.iter_lines()) if line.strip()]
    return started, lines


def test_native_stream_equals_the_whole_text(real_server, real_tokenizer):
    prompt = real_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    body = {"prompt": prompt, "max_new_tokens": MAX_TOKENS, "temperature": 0}
    started, lines = native_stream(real_server, body)
    whole = httpx.post(
        real_server.predictions_url, json={**body, "stream": False}, headers=real_server.headers, timeout=300
    )
    assert whole.status_code == 200, whole.text
    whole_text = whole.json()["text"]
    streamed = "".join(line.get("text", "") for _, line in lines)
    print(f"native ({len(lines)} lines): {streamed!r}")

    assert streamed == whole_text
    assert "\ufffd" not in streamed
    assert beyond_latin(streamed), streamed  # the detokenizer really had multi-byte characters to hold back
    assert lines[-1][1]["finish_reason"] == whole.json()["finish_reason"] == "length"
    assert lines[-1][1]["usage"]["completion_tokens"] == MAX_TOKENS
    assert sum(1 for _, line in lines if line.get("text")) > 1
    assert_first_arrived_while_generating(started, [at for at, _ in lines], BATCH_DELAY_S)


def test_chat_stream_equals_the_whole_message_and_the_native_text(real_server, real_client, real_tokenizer):
    started = time.perf_counter()  # create() returns once the first event is in
    stream = real_client.chat.completions.create(
        model=real_server.model_name,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    arrivals = list(timed(stream))
    chunks = [chunk for _, chunk in arrivals]
    pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    streamed = "".join(pieces)
    print(f"chat ({len(pieces)} chunks): {streamed!r}")
    whole = real_client.chat.completions.create(
        model=real_server.model_name, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0
    )

    assert streamed == whole.choices[0].message.content
    assert "\ufffd" not in streamed
    assert beyond_latin(streamed), streamed
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == MAX_TOKENS
    assert sum(1 for piece in pieces if piece) > 1
    assert_first_arrived_while_generating(started, [at for at, _ in arrivals], BATCH_DELAY_S)

    # The chat route renders the same template: the native route's greedy text is the same.
    prompt = real_tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    native = httpx.post(
        real_server.predictions_url,
        json={"prompt": prompt, "max_new_tokens": MAX_TOKENS, "temperature": 0, "stream": False},
        headers=real_server.headers,
        timeout=300,
    )
    assert native.json()["text"] == streamed
