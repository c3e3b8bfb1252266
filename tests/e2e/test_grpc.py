"""TorchServe's gRPC inference API (always on in 0.11 and 0.12) against the real server, with a
client compiled from the installed jar's own proto (tests/support/grpc_client.py). Every gRPC call gets the
whole answer, in one message (handler/serving/grpc_jobs.py), never a cut one with status OK; no call
ends the worker, and an HTTP stream beside them is served whole.

A request the handler refuses comes back with gRPC status OK and the route's JSON error inside:
TorchServe's `GRPCJob.response` drops the reply's status code, and the only way to a gRPC error
status (a whole-batch error) would fail every request in flight (docs/operations.md#grpc). Only the
frontend's own refusals (a wrong key, an unknown model) have a non-OK status."""

from __future__ import annotations

import json
import threading
from typing import Any

import grpc
import httpx
import pytest

from scripts.serve.torchserve_compat import has_secure_defaults
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


BAD_REQUESTS = {
    "max_new_tokens": ({**PROMPT, "max_new_tokens": -1}, "max_new_tokens"),
    "prompt": ({"prompt": ""}, "prompt"),
}


def stream_answer(client: Any, pb2: Any, served: TorchServe, body: dict[str, Any]) -> tuple[grpc.StatusCode, list[Any]]:
    """(the call's gRPC status, its messages) of a StreamPredictions call (a non-OK status raises)."""
    call = client.StreamPredictions(request(pb2, served, body), metadata=metadata(served), timeout=60)
    messages = list(call)
    return call.code(), messages


def refusal(client: Any, method: str, message: Any, metadata: list[tuple[str, str]]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as refused:
        if method == "Predictions":
            client.Predictions(message, metadata=metadata, timeout=30)
        else:
            list(client.StreamPredictions(message, metadata=metadata, timeout=30))
    return refused.value


@pytest.mark.parametrize("bad", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_a_refused_grpc_request_is_status_ok_with_the_error_inside_and_its_neighbours_are_served(served, stub, bad):
    """What a gRPC client gets for a 400, on both methods, while a good gRPC call and an HTTP stream
    run in the same continuous batch: status OK, one message, the route's error JSON; the good ones whole."""
    body, param = bad
    pb2, client = stub
    pids = served.worker_pids()
    streaming = threading.Event()
    bystander: dict[str, Any] = {}

    def stream_beside() -> None:
        long = {**PROMPT, "max_new_tokens": 200}
        try:
            with httpx.stream("POST", served.predictions_url, json=long, headers=served.headers, timeout=60) as r:
                lines = []
                for line in r.iter_lines():
                    if line:
                        lines.append(json.loads(line))
                        streaming.set()
                bystander["lines"] = lines
        finally:
            streaming.set()

    thread = threading.Thread(target=stream_beside)
    thread.start()
    assert streaming.wait(timeout=60)  # the HTTP stream is in flight: it shares the bad calls' batches
    good = client.Predictions.future(request(pb2, served, PROMPT), metadata=metadata(served), timeout=60)

    reply, call = client.Predictions.with_call(request(pb2, served, body), metadata=metadata(served), timeout=30)
    assert call.code() == grpc.StatusCode.OK  # not INVALID_ARGUMENT: GRPCJob.response drops the 400
    assert json.loads(reply.prediction)["error"]["param"] == param
    code, messages = stream_answer(client, pb2, served, {**body, "stream": True})
    assert code == grpc.StatusCode.OK and len(messages) == 1
    assert json.loads(messages[0].prediction)["error"]["param"] == param

    assert json.loads(good.result().prediction)["usage"]["completion_tokens"] == 40
    assert good.code() == grpc.StatusCode.OK
    thread.join(timeout=60)
    assert bystander["lines"][-1]["usage"]["completion_tokens"] == 200
    assert served.worker_pids() == pids


def test_only_the_frontends_own_refusals_have_a_grpc_status(served, stub):
    """Refused before any worker sees them, with a status from TorchServe's gRPC service: an unknown
    model is INTERNAL (InferenceImpl, not NOT_FOUND), a wrong key PERMISSION_DENIED (GRPCInterceptor, 0.12)."""
    pb2, client = stub
    unknown = pb2.PredictionsRequest(model_name="no-such-model", input={"data": json.dumps(PROMPT).encode()})
    for method in ("Predictions", "StreamPredictions"):
        refused = refusal(client, method, unknown, metadata(served))
        assert refused.code() == grpc.StatusCode.INTERNAL and "no-such-model" in refused.details()
        if has_secure_defaults():  # TorchServe 0.11 has no token authorization
            wrong_key = [("authorization", "Bearer wrong")]
            assert (
                refusal(client, method, request(pb2, served, PROMPT), wrong_key).code()
                == grpc.StatusCode.PERMISSION_DENIED
            )
