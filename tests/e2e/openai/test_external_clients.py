"""Unmodified external clients against a real torchserve: the official `openai` client
and guidellm 0.8.1 (the benchmark tool only measures OpenAI-style SSE servers)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
import openai
import pytest

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.guidellm_env import guidellm_bin
from tests.support.openai import E2E_MODEL_CONFIG
from tests.support.sse import DONE, events
from tests.support.streaming import assert_first_arrived_while_generating, timed

pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/support/asgi_frontend.py)
BATCH_DELAY_S = E2E_MODEL_CONFIG["maxBatchDelay"] / 1000
STREAM_TOKENS = 200  # generating them takes well over the batch delay: buffering could not pass as streaming


@pytest.fixture(scope="module")
def client(openai_base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_base_url, api_key=api_key, max_retries=0, timeout=60)


def test_openai_client_streams_a_completion(client: openai.OpenAI, server):
    started = time.perf_counter()  # create() returns once the first event is in
    stream = client.completions.create(
        model=server.model_name,
        prompt="Once upon a time",
        max_tokens=STREAM_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    arrivals = list(timed(stream))
    chunks = [chunk for _, chunk in arrivals]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage.completion_tokens == STREAM_TOKENS
    assert_first_arrived_while_generating(started, [at for at, _ in arrivals], BATCH_DELAY_S)
    whole = client.completions.create(
        model=server.model_name,
        prompt="Once upon a time",
        max_tokens=24,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.usage.completion_tokens == 24 and whole.choices[0].finish_reason == "length"
    assert text  # sampled text streamed; the greedy call above returns a whole body


def test_openai_client_streams_a_chat_completion(client: openai.OpenAI, server):
    started = time.perf_counter()
    stream = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}],
        max_completion_tokens=STREAM_TOKENS,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    arrivals = list(timed(stream))
    chunks = [chunk for _, chunk in arrivals]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == STREAM_TOKENS
    assert_first_arrived_while_generating(started, [at for at, _ in arrivals], BATCH_DELAY_S)
    whole = client.chat.completions.create(
        model=server.model_name,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}],
        max_completion_tokens=STREAM_TOKENS,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert whole.choices[0].message.content == streamed


@pytest.mark.skipif(
    not has_secure_defaults(), reason="TorchServe 0.11 passes no url_path, and a GET has no body to recognise"
)
def test_openai_client_lists_models(client: openai.OpenAI, server):
    assert [m.id for m in client.models.list()] == [server.model_name]


def test_openai_client_reads_errors(client: openai.OpenAI, server):
    with pytest.raises(openai.BadRequestError) as excinfo:
        client.completions.create(model=server.model_name, prompt="x", n=9)
    assert excinfo.value.status_code == 400
    assert excinfo.value.body["param"] == "n"


def test_curl_style_sse_stream(server, openai_base_url: str):
    body = {"model": server.model_name, "prompt": "Today", "max_tokens": STREAM_TOKENS}
    body |= {"stream": True, "ignore_eos": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"{openai_base_url}/completions", json=body, headers=server.headers, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        arrivals = list(timed(r.iter_text()))  # what `curl -N` prints as it comes
    parsed = events("".join(text for _, text in arrivals))
    assert parsed[-1] == DONE and parsed[-2]["choices"][0]["finish_reason"] == "length"
    assert_first_arrived_while_generating(started, [at for at, _ in arrivals], BATCH_DELAY_S)


@pytest.mark.torchserve_only
@pytest.mark.timeout(600)  # installs guidellm's venv first when `make guidellm` has not (about a minute)
def test_guidellm_benchmark_has_no_failed_requests(server, api_key: str, tiny_model_dir: Path, tmp_path: Path):
    report = tmp_path / "guidellm.json"
    backend = {
        "kind": "openai_http",
        "target": server.url,
        "model": server.model_name,
        "api_key": api_key,
        "request_format": "/v1/completions",
        "api_routes": {
            "/health": "ping",
            "/v1/models": f"predictions/{server.model_name}/1.0/v1/models",
            "/v1/completions": f"predictions/{server.model_name}/1.0/v1/completions",
        },
        "http2": False,
    }
    command = [
        str(guidellm_bin()),
        "run",
        "--backend",
        json.dumps(backend),
        "--tokenizer",
        f"kind=hf_auto,model={tiny_model_dir}",
        "--data",
        "kind=synthetic_text,prompt_tokens=32,output_tokens=32",
        "--profile",
        "kind=concurrent,streams=4",
        "--constraint",
        "kind=max_requests,count=20",
        "--output",
        f"kind=json,path={report}",
        "--disable-console-interactive",
    ]
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "GUIDELLM__LOGGING__CONSOLE_LOG_LEVEL": "WARNING",
    }
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": 20, "errored": 0, "incomplete": 0, "total": 20}
    # token counts come only from `usage`; ignore_eos makes every request run to max_tokens
    output_tokens = metrics["output_token_count"]["successful"]
    assert (output_tokens["min"], output_tokens["max"], output_tokens["count"]) == (32, 32, 20)
    assert metrics["time_to_first_token_ms"]["successful"]["count"] == 20
    print(
        "guidellm concurrent@4, 20 requests, 32 in / 32 out: "
        f"TTFT median {metrics['time_to_first_token_ms']['successful']['median']:.1f} ms, "
        f"ITL median {metrics['inter_token_latency_ms']['successful']['median']:.2f} ms, "
        f"output {metrics['output_tokens_per_second']['successful']['mean']:.1f} tok/s (mean)"
    )


@pytest.mark.torchserve_only  # the ASGI side runs in-process: tests/integration/asgi/test_routes.py
@pytest.mark.parametrize("query", ["", "?model_name=llama"])
def test_invocations_with_a_decoded_json_body(server, query):
    # Plain torchserve decodes application/json bodies (SageMaker's toolkit does not:
    # tests/sagemaker covers the bytes case); /invocations reaches the native route either way.
    body = {"prompt": "Once upon a time", "max_new_tokens": 6, "ignore_eos": True, "stream": False}
    response = httpx.post(f"{server.url}/invocations{query}", json=body, headers=server.headers, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 6
