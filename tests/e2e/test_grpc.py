"""TorchServe's gRPC inference API (always on in 0.11 and 0.12) against the real server, with a
client compiled from the installed jar's own proto (tests/support/grpc_client.py). Every gRPC call gets the
whole answer, in one message (handler/serving/grpc_jobs.py), never a cut one with status OK; no call
ends the worker, and an HTTP stream beside them is served whole."""

from __future__ import annotations

import json
import threading
from typing import Any

import grpc
import httpx
import pytest

from tests.support.grpc_client import inference_modules
from tests.support.torchserve_process import TorchServe

PROMPT = {"prompt": "Today the weather is", "max_new_tokens": 40, "ignore_eos": True}


@pytest.fixture(scope="module")
def served(continuous_server: TorchServe) -> TorchServe:
    return continuous_server


@pytest.fixture(scope="module")
def stub(served: TorchServe, tmp_path_factory: pytest.TempPathFactory):
    pb2, pb2_grpc = inference_modules(tmp_path_factory.mktemp("grpc-client"))
    channel = grpc.insecure_channel(f"127.0.0.1:{served.grpc_inference_port}")
    yield pb2, pb2_grpc.InferenceAPIsServiceStub(channel)
    channel.close()


def metadata(served: TorchServe) -> list[tuple[str, str]]:
    """gRPC takes the inference key as HTTP does (none where TorchServe has no token auth: 0.11)."""
    return [(name.lower(), value) for name, value in served.headers.items()]


def request(pb2: Any, served: TorchServe, body: dict[str, Any]) -> Any:
    return pb2.PredictionsRequest(model_name=served.model_name, input={"data": json.dumps(body).encode()})


def http_answer(served: TorchServe, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(served.predictions_url, json={**body, "stream": False}, headers=served.headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def test_unary_predictions_get_the_whole_answer(served, stub):
    pb2, client = stub
    reply = client.Predictions(request(pb2, served, PROMPT), metadata=metadata(served), timeout=60)
    answer = json.loads(reply.prediction)
    assert answer["usage"]["completion_tokens"] == 40
    assert answer == http_answer(served, PROMPT)  # greedy: the same text as over HTTP


def test_stream_predictions_end_with_the_whole_answer(served, stub):
    pb2, client = stub
    body = {**PROMPT, "stream": True}
    messages = list(client.StreamPredictions(request(pb2, served, body), metadata=metadata(served), timeout=60))
    assert len(messages) == 1  # the frontend would drop the job after a first chunk: it is the whole answer
    answer = json.loads(messages[0].prediction)
    assert answer["usage"]["completion_tokens"] == 40 and answer == http_answer(served, PROMPT)


def test_a_bad_grpc_request_ends_cleanly_and_nothing_else_is_hurt(served, stub):
    pb2, client = stub
    pids = served.worker_pids()
    bystander: dict[str, Any] = {}

    def stream_beside() -> None:
        body = {**PROMPT, "max_new_tokens": 200}
        with httpx.stream("POST", served.predictions_url, json=body, headers=served.headers, timeout=60) as r:
            bystander["lines"] = [json.loads(line) for line in r.iter_lines() if line]

    thread = threading.Thread(target=stream_beside)
    thread.start()
    for call in (client.Predictions, client.StreamPredictions):
        replies = call(request(pb2, served, {"prompt": ""}), metadata=metadata(served), timeout=30)
        replies = [replies] if call is client.Predictions else list(replies)
        assert len(replies) == 1
        error = json.loads(replies[0].prediction)["error"]  # the route's error body (gRPC status stays OK)
        assert error["param"] == "prompt"
    thread.join(timeout=60)
    assert bystander["lines"][-1]["usage"]["completion_tokens"] == 200
    assert served.worker_pids() == pids
