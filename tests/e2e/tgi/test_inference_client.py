"""huggingface_hub's `InferenceClient.text_generation`, unmodified, against a real torchserve
with the hf backend, in both scheduling modes: the TGI routes and the unrouted (/invocations) path."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

from tests.support.modes import with_mode
from tests.support.streaming import assert_first_arrived_while_generating, timed
from tests.support.tgi import FAILPOINT_MARKER, HAS_URL_PATH, TGI_MODEL_CONFIG
from tests.support.torchserve_process import TorchServe

pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/support/asgi_frontend.py)
PROMPT = "Once upon a time"


def test_non_streamed_text(client: InferenceClient):
    text = client.text_generation(PROMPT, max_new_tokens=12)
    assert isinstance(text, str) and text


def test_streamed_text_is_the_non_streamed_text(client: InferenceClient):
    pieces = list(client.text_generation(PROMPT, max_new_tokens=12, stream=True))
    assert len(pieces) > 1  # one event per token
    assert "".join(pieces) == client.text_generation(PROMPT, max_new_tokens=12)  # greedy: same text


def test_details_list_each_token_with_its_id_and_logprob(client: InferenceClient):
    out = client.text_generation(PROMPT, max_new_tokens=10, details=True, top_n_tokens=2)
    details = out.details
    assert details.finish_reason in ("length", "eos_token")
    assert details.generated_tokens == len(details.tokens) <= 10
    assert details.finish_reason == "eos_token" or details.generated_tokens == 10
    assert all(isinstance(t.id, int) and math.isfinite(t.logprob) and t.logprob <= 0 for t in details.tokens)
    assert "".join(t.text for t in details.tokens) == out.generated_text
    assert details.seed is None  # greedy
    # greedy: the chosen token is the most likely one, so it heads its top tokens with the same logprob
    for token, tops in zip(details.tokens, details.top_tokens, strict=True):
        best = [_field(top, "id") for top in tops], _field(tops[0], "logprob")
        assert len(tops) == 2 and best[0][0] == token.id and best[1] == pytest.approx(token.logprob)


def test_a_seeded_sampled_request_reports_its_seed_and_repeats(client: InferenceClient):
    first = client.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=11, details=True)
    again = client.text_generation(PROMPT, max_new_tokens=8, do_sample=True, seed=11, details=True)
    assert first.details.seed == 11 and first.generated_text == again.generated_text


def test_stream_with_details(client: InferenceClient):
    events = list(client.text_generation(PROMPT, max_new_tokens=10, stream=True, details=True, top_n_tokens=2))
    assert all(e.token is not None and isinstance(e.token.id, int) for e in events)
    assert all(len(e.top_tokens) == 2 and _field(e.top_tokens[0], "id") == e.token.id for e in events)  # greedy
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.details.finish_reason in ("length", "eos_token")
    assert last.details.generated_tokens == len(events)
    assert "".join(e.token.text for e in events) == last.generated_text
    assert all(math.isfinite(e.token.logprob) for e in events)
    whole = client.text_generation(PROMPT, max_new_tokens=10, details=True)
    assert [e.token.id for e in events] == [t.id for t in whole.details.tokens]


def test_events_arrive_while_generating(server, generate_url: str):
    # 400 tokens: generating them takes several times the batch window even on the tiny model
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 400, "ignore_eos": True}, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", generate_url, json=body, headers=server.headers, timeout=60) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        arrivals = list(timed(response.iter_text()))
    events = [json.loads(line[len("data:") :]) for line in "".join(t for _, t in arrivals).splitlines() if line]
    assert len(events) == 400 and events[-1]["generated_text"] == "".join(e["token"]["text"] for e in events)
    batch_delay_s = with_mode(TGI_MODEL_CONFIG, server.mode)["maxBatchDelay"] / 1000
    assert_first_arrived_while_generating(started, [at for at, _ in arrivals], batch_delay_s)


def test_return_full_text(client: InferenceClient):
    text = client.text_generation(PROMPT, max_new_tokens=4, return_full_text=True)
    assert text.startswith(PROMPT) and text != PROMPT


def test_stop_sequence(client: InferenceClient):
    free = client.text_generation(PROMPT, max_new_tokens=12, details=True)
    tokens = free.details.tokens
    stop = next((t.text for t in tokens[2:] if t.text.strip()), None)
    assert stop, "the tiny model produced no text to stop at"
    out = client.text_generation(PROMPT, max_new_tokens=12, stop=[stop], details=True)
    assert out.details.finish_reason == "stop_sequence"
    assert out.generated_text == free.generated_text[: free.generated_text.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_a_validation_error_raises_the_clients_validation_error(client: InferenceClient, stream: bool):
    with pytest.raises(ValidationError, match="`top_n_tokens` must be >= 0 and <= 5"):
        out = client.text_generation(PROMPT, max_new_tokens=4, top_n_tokens=9, stream=stream)
        list(out) if stream else None
    with pytest.raises(ValidationError, match="`watermark` is not supported"):
        out = client.text_generation(PROMPT, max_new_tokens=4, watermark=True, stream=stream)
        list(out) if stream else None


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_validation_errors_are_422_with_tgi_keys(server, generate_url: str):
    body = {"inputs": PROMPT, "parameters": {"temperature": 0}}
    response = httpx.post(generate_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 422
    assert response.json() == {
        "error": "Input validation error: `temperature` must be strictly positive",
        "error_type": "validation",
    }


def test_a_failed_generation_is_424_or_a_last_error_event(server, generate_url: str):
    body = {"inputs": f"{PROMPT} {FAILPOINT_MARKER}", "parameters": {"max_new_tokens": 20, "ignore_eos": True}}
    response = httpx.post(generate_url, json=body, headers=server.headers, timeout=60)
    # TorchServe in continuous mode opens a response before its prefill (to learn whether its client
    # is there: docs/operations.md#a-client-that-leaves), so the failure comes under its 200
    opened_early = isinstance(server, TorchServe) and getattr(server, "mode", None) == "continuous"
    assert response.status_code == (200 if opened_early else 424)
    assert response.json()["error_type"] == "generation"
    response = httpx.post(generate_url, json={**body, "stream": True}, headers=server.headers, timeout=60)
    assert response.status_code == 200  # the first tokens went out before the failing step
    events = [json.loads(line[len("data:") :]) for line in response.text.splitlines() if line]
    assert all("token" in e for e in events[:-1]) and len(events) > 1
    assert events[-1]["error_type"] == "generation" and events[-1]["error"]
    assert httpx.post(generate_url, json={"inputs": PROMPT}, headers=server.headers, timeout=60).status_code == 200


def test_decoder_input_details_give_the_prompt_logprobs(client: InferenceClient, tiny_tokenizer):
    """Needs the backends' prompt logprobs (the logprobs branch); the first prompt token has none."""
    out = client.text_generation(PROMPT, max_new_tokens=2, details=True, decoder_input_details=True)
    prompt_ids = tiny_tokenizer(PROMPT)["input_ids"]
    assert [t.id for t in out.details.prefill] == prompt_ids
    assert out.details.prefill[0].logprob is None
    assert all(math.isfinite(t.logprob) and t.logprob <= 0 for t in out.details.prefill[1:])


def _field(obj, name: str):
    """huggingface_hub parses top_tokens' inner lists as plain dicts (its parser does not recurse there)."""
    return obj[name] if isinstance(obj, dict) else getattr(obj, name)


# -- which route answers what ----------------------------------------------------------
@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
def test_generate_answers_one_object_and_generate_stream_always_streams(server, generate_url: str):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 3}}
    response = httpx.post(generate_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    # 0.11 passes no url_path: the unrouted TGI body is answered as TGI's POST / does, as a list
    whole = response.json() if HAS_URL_PATH else response.json()[0]
    assert set(whole) == {"generated_text"}
    response = httpx.post(f"{generate_url}_stream", json=body, headers=server.headers, timeout=60)
    assert response.status_code == 200
    if HAS_URL_PATH:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[len("data:") :]) for line in response.text.splitlines() if line]
        assert events[-1]["generated_text"] == whole["generated_text"]
    else:  # without url_path the body's `stream` decides
        assert response.json()[0] == whole


def test_invocations_answers_tgi_bodies_as_a_list_and_keeps_native_bodies_native(server, api_key: str):
    url = f"{server.url}/invocations"
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 3, "details": True}}
    response = httpx.post(url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 200
    (whole,) = response.json()
    assert whole["details"]["generated_tokens"] == len(whole["details"]["tokens"]) <= 3
    native = {"prompt": PROMPT, "max_new_tokens": 3, "stream": False}
    response = httpx.post(url, json=native, headers=server.headers, timeout=60)
    assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] <= 3
    response = httpx.post(url, json={**native, "stream": True}, headers=server.headers, timeout=60)
    assert response.headers["content-type"].startswith("application/x-ndjson")
    assert json.loads(response.text.splitlines()[-1])["finish_reason"] in ("eos", "length")
    client = InferenceClient(base_url=url, api_key=api_key, timeout=60)
    text = client.text_generation(PROMPT, max_new_tokens=6)
    assert "".join(client.text_generation(PROMPT, max_new_tokens=6, stream=True)) == text
    with pytest.raises(ValidationError):
        client.text_generation(PROMPT, max_new_tokens=0)
