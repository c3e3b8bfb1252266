"""The ASGI frontend's routes in-process (httpx's ASGITransport, the sim backend): every named route of
handler/api/routes.py answers at each of its paths (its top-level ones and TorchServe's
/predictions/<model>/<version>/<route>), whole and streamed, in its own wire format; the unnamed
routes (/predictions/<model>, /invocations) by the body's shape; and the frontend's refusals in
JSON: 401 without the key, 404, 405, 413, a bad field's 400 (TGI: 422) naming it.

What needs a real server stays in tests/e2e (test_asgi_frontend.py and the modules marked
both_frontends): sockets, HTTP framing, timing, disconnects, signals, the process."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from handler.api.routes import ROUTES, Route
from tests.integration.asgi.conftest import BODY_LIMIT
from tests.support.asgi_inprocess import InProcessFrontend

MODEL = "llama"
PROMPT = "Once upon a time"
TOKENS = 4
DONE = "[DONE]"
CHAT = [{"role": "user", "content": PROMPT}]
OPENAI_LENGTH = {"max_tokens": TOKENS, "ignore_eos": True, "temperature": 0}  # greedy: OpenAI samples by default
NATIVE_BODY = {"prompt": PROMPT, "max_new_tokens": TOKENS, "ignore_eos": True}
# Each generation route of the table: its wire format and a valid body (a new route needs its sample
# here: test_every_generation_route_has_a_sample).
SAMPLES: dict[str, tuple[str, dict[str, Any]]] = {
    "v1/completions": ("openai", {"model": MODEL, "prompt": PROMPT, **OPENAI_LENGTH}),
    "v1/chat/completions": ("openai", {"model": MODEL, "messages": CHAT, **OPENAI_LENGTH}),
    "generate": ("tgi", {"inputs": PROMPT, "parameters": {"max_new_tokens": TOKENS, "ignore_eos": True}}),
    "generate_stream": ("tgi", {"inputs": PROMPT, "parameters": {"max_new_tokens": TOKENS, "ignore_eos": True}}),
    "v1/responses": (
        "responses",
        {"model": MODEL, "input": PROMPT, "max_output_tokens": TOKENS, "ignore_eos": True, "temperature": 0},
    ),
}
# A bad field of each route's body, and the name its error gives it.
BAD_FIELDS: dict[str, tuple[dict[str, Any], str]] = {
    "v1/completions": ({"temperature": -1}, "temperature"),
    "v1/chat/completions": ({"messages": []}, "messages"),
    "generate": ({"parameters": {"temperature": 0}}, "temperature"),
    "generate_stream": ({"parameters": {"temperature": 0}}, "temperature"),
    "v1/responses": ({"max_output_tokens": 0}, "max_output_tokens"),
}


def generation_routes() -> list[Route]:
    return [route for route in ROUTES if "generate" in route.tasks and route.generates]


def concrete(path: str) -> str:
    return path.replace("{model_id:path}", MODEL)


def served_at() -> list[Any]:
    """(route name, path) for every generation route at each of its paths, TorchServe's included."""
    return [
        pytest.param(route.name, path, id=path)
        for route in generation_routes()
        for path in (*route.paths, f"/predictions/{MODEL}/1.0/{route.name}")
        if "{" not in path  # v1/responses/<id> reads a stored response: it generates nothing
    ]


def sse(text: str) -> list[Any]:
    """Server-sent events' payloads in order (`data:`, with or without the space TGI leaves out);
    `[DONE]` stays a string. Every event ends in a blank line."""
    assert text.endswith("\n\n"), text[-80:]
    out: list[Any] = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data:"), block
        payload = block[len("data:") :].strip()
        out.append(payload if payload == DONE else json.loads(payload))
    return out


def ndjson(text: str) -> list[dict[str, Any]]:
    assert text.endswith("\n"), text[-80:]
    return [json.loads(line) for line in text.splitlines()]


def streamed_text(wire: str, response: httpx.Response) -> str:
    """A 200 stream's whole text, once its framing and its end are checked."""
    assert response.status_code == 200, response.text
    if wire == "native":
        assert response.headers["content-type"] == "application/x-ndjson"
        lines = ndjson(response.text)
        assert lines[-1]["finish_reason"] == "length" and lines[-1]["usage"]["completion_tokens"] == TOKENS
        return "".join(line["text"] for line in lines)
    assert response.headers["content-type"].startswith("text/event-stream")
    if wire == "responses":  # `event: <type>` before each `data:`, no [DONE]
        events = [json.loads(block.split("\ndata: ")[1]) for block in response.text.split("\n\n")[:-1]]
        assert events[-1]["type"] == "response.incomplete"
        assert events[-1]["response"]["usage"]["output_tokens"] == TOKENS
        return "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    events = sse(response.text)
    if wire == "tgi":
        assert all(event["generated_text"] is None for event in events[:-1])
        text = "".join(event["token"]["text"] for event in events)
        assert len(events) == TOKENS and events[-1]["generated_text"] == text
        return text
    assert events[-1] == DONE and events[-2]["choices"][0]["finish_reason"] == "length"
    return "".join(c.get("text") or c.get("delta", {}).get("content") or "" for e in events[:-1] for c in e["choices"])


def whole_text(wire: str, response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    if wire == "native":
        assert body["finish_reason"] == "length" and body["usage"]["completion_tokens"] == TOKENS
        return body["text"]
    if wire == "tgi":
        assert set(body) == {"generated_text"}
        return body["generated_text"]
    if wire == "responses":
        assert body["status"] == "incomplete" and body["usage"]["output_tokens"] == TOKENS
        return body["output"][0]["content"][0]["text"]
    (choice,) = body["choices"]
    assert choice["finish_reason"] == "length" and body["usage"]["completion_tokens"] == TOKENS
    return choice["text"] if "text" in choice else choice["message"]["content"]


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    return response.json()["error"]


# -- every route answers ---------------------------------------------------------------
def test_every_generation_route_has_a_sample():
    assert {route.name for route in generation_routes()} == set(SAMPLES) == set(BAD_FIELDS)


@pytest.mark.parametrize(("name", "path"), served_at())
def test_each_route_answers_whole_and_streamed_in_its_format(frontend: InProcessFrontend, name: str, path: str):
    wire, body = SAMPLES[name]
    streamed = frontend.post(path, json={**body, "stream": True})
    text = streamed_text(wire, streamed)
    whole = frontend.post(path, json={**body, "stream": False})
    if name == "generate_stream":  # streams whatever the body says
        assert streamed_text(wire, whole) == text
    else:
        assert whole_text(wire, whole) == text  # greedy: the same text either way


@pytest.mark.parametrize("path", [f"/predictions/{MODEL}", f"/predictions/{MODEL}/1.0", "/invocations"])
def test_without_a_route_a_native_body_is_native_ndjson_or_json(frontend: InProcessFrontend, path: str):
    streamed = frontend.post(path, json=NATIVE_BODY)  # streams by default
    text = streamed_text("native", streamed)
    whole = frontend.post(path, json={**NATIVE_BODY, "stream": False})
    assert whole_text("native", whole) == text
    assert ndjson(streamed.text)[-1]["usage"] == whole.json()["usage"]


def test_generate_answers_one_object_and_generate_stream_the_same_text_as_events(frontend: InProcessFrontend):
    _, body = SAMPLES["generate"]
    whole = whole_text("tgi", frontend.post("/generate", json=body))  # `stream` absent: one object
    assert streamed_text("tgi", frontend.post("/generate_stream", json=body)) == whole


@pytest.mark.parametrize("path", [f"/predictions/{MODEL}", "/invocations"])
@pytest.mark.parametrize("name", ["v1/completions", "v1/chat/completions"])
def test_without_a_route_an_openai_body_is_answered_as_openai(frontend: InProcessFrontend, path: str, name: str):
    wire, body = SAMPLES[name]
    text = streamed_text(wire, frontend.post(path, json={**body, "stream": True}))
    assert whole_text(wire, frontend.post(path, json=body)) == text


def test_invocations_takes_the_model_name_query(frontend: InProcessFrontend):
    response = frontend.post("/invocations?model_name=llama", json={**NATIVE_BODY, "stream": False})
    assert whole_text("native", response)


def test_plain_text_and_what_json_cannot_read(frontend: InProcessFrontend):
    """A body that is a bare prompt (sent as JSON, as the seed's SageMaker client does) is served;
    cut JSON is a 400 naming the body; a byte order mark before JSON is read as JSON."""
    plain = frontend.post(
        frontend.predictions_path, content=PROMPT.encode(), headers={"Content-Type": "application/json"}
    )
    assert ndjson(plain.text)[-1]["finish_reason"] in {"eos", "length"}
    cut = frontend.post(frontend.predictions_path, content=b'{"prompt": "unterminated')
    assert error_of(cut, 400)["param"] == "body"
    bom = b"\xef\xbb\xbf" + json.dumps({**NATIVE_BODY, "stream": False}).encode()
    assert whole_text("native", frontend.post(frontend.predictions_path, content=bom))


@pytest.mark.parametrize(
    ("headers", "param"),
    [
        ({"Content-Type": "application/x-www-form-urlencoded"}, "Content-Type"),
        ({"Content-Type": "application/json", "Content-Encoding": "gzip"}, "Content-Encoding"),
    ],
    ids=["form", "gzip"],
)
def test_a_body_the_handler_cannot_read_is_a_415_naming_the_header(frontend, headers: dict[str, str], param: str):
    response = frontend.post(frontend.predictions_path, content=json.dumps(NATIVE_BODY).encode(), headers=headers)
    assert error_of(response, 415)["param"] == param


@pytest.mark.parametrize("name", ["v1/completions", "v1/chat/completions"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_n_outputs(frontend: InProcessFrontend, name: str, stream: bool):
    _, body = SAMPLES[name]
    response = frontend.post(f"/{name}", json={**body, "n": 2, "stream": stream})
    assert response.status_code == 200, response.text
    if not stream:
        choices = response.json()["choices"]
        assert [c["index"] for c in choices] == [0, 1] and {c["finish_reason"] for c in choices} == {"length"}
        assert response.json()["usage"]["completion_tokens"] == 2 * TOKENS
        return
    events = sse(response.text)
    assert events[-1] == DONE
    finished = {c["index"]: c["finish_reason"] for e in events[:-1] for c in e["choices"] if c["finish_reason"]}
    assert finished == {0: "length", 1: "length"}


# -- the model listing -----------------------------------------------------------------
@pytest.mark.parametrize("prefix", ["", f"/predictions/{MODEL}/1.0"])
def test_the_model_listing_needs_no_body(frontend: InProcessFrontend, prefix: str):
    listing = frontend.get(f"{prefix}/v1/models")
    assert listing.status_code == 200 and [m["id"] for m in listing.json()["data"]] == [MODEL]
    assert frontend.post(f"{prefix}/v1/models").json() == listing.json()  # POST too, as TorchServe takes it
    card = frontend.get(f"{prefix}/v1/models/{MODEL}")
    assert card.status_code == 200 and card.json()["id"] == MODEL
    assert error_of(frontend.get(f"{prefix}/v1/models/another-model"), 404)["param"] == "model"


def test_the_embedding_route_of_a_generation_archive_says_which_archive_serves_it(frontend: InProcessFrontend):
    for path in ("/v1/embeddings", f"/predictions/{MODEL}/1.0/v1/embeddings"):
        error = error_of(frontend.post(path, json={"model": MODEL, "input": "x"}), 400)
        assert "handler.task: embed" in error["message"]


# -- refusals --------------------------------------------------------------------------
def every_path() -> list[tuple[str, str]]:
    """(method, path): each path of the table with its first method, and the paths outside it."""
    named = [(route.methods[0], concrete(path)) for route in ROUTES for path in route.paths]
    outside = [("POST", f"/predictions/{MODEL}"), ("POST", "/invocations"), ("GET", "/ping"), ("GET", "/metrics")]
    return named + outside + [("POST", "/nowhere"), ("OPTIONS", "/")]


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-key", "Basic abc", "Bearer"])
def test_without_the_key_every_path_is_a_401_in_json(frontend: InProcessFrontend, authorization: str | None):
    headers = {} if authorization is None else {"Authorization": authorization}
    for method, path in every_path():
        response = frontend.request(method, path, auth=False, headers=headers, json=NATIVE_BODY)
        assert error_of(response, 401)["type"] == "authentication_error", path
        assert response.headers["www-authenticate"] == "Bearer"
        assert "version" not in response.text.lower()


@pytest.mark.parametrize(
    "path", ["/nowhere", "/v1/nowhere", f"/predictions/{MODEL}/1.0/v1/unknown", "/predictions/another-model"]
)
def test_unknown_paths_and_models_are_a_404_in_json(frontend: InProcessFrontend, path: str):
    assert error_of(frontend.post(path, json=NATIVE_BODY), 404)["type"] == "not_found_error"


def test_a_method_a_route_does_not_take_is_a_405_naming_what_it_takes(frontend: InProcessFrontend):
    for route in ROUTES:
        if "DELETE" in route.methods:
            continue  # v1/responses: DELETE with an id (test_responses_api.py)
        for path in (*route.paths, f"/predictions/{MODEL}/1.0/{route.name}"):
            response = frontend.request("DELETE", concrete(path))
            assert error_of(response, 405)["param"] == "method", path
            assert set(route.methods) <= set(response.headers["allow"].split(", ")), path
        if "GET" not in route.methods:  # TorchServe's path takes GET for the routes without a body only
            response = frontend.get(f"/predictions/{MODEL}/1.0/{route.name}")
            assert error_of(response, 405)["param"] == "method" and response.headers["allow"] == "POST"


@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", f"/predictions/{MODEL}"), ("POST", "/ping"), ("POST", "/metrics"), ("GET", "/invocations")],
)
def test_other_methods_outside_the_table_are_a_405(frontend: InProcessFrontend, method: str, path: str):
    response = frontend.request(method, path)
    assert error_of(response, 405)["param"] == "method" and response.headers["allow"]


@pytest.mark.parametrize(("name", "path"), served_at())
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_bad_field_is_refused_naming_it(frontend: InProcessFrontend, name: str, path: str, stream: bool):
    """Before any text: a 400 with the route's error body naming the field (TGI: its 422 and keys)."""
    wire, body = SAMPLES[name]
    fields, named = BAD_FIELDS[name]
    response = frontend.post(path, json={**body, **fields, "stream": stream})
    if wire == "tgi":
        assert response.status_code == 422, response.text
        assert response.json() == {
            "error": f"Input validation error: `{named}` must be strictly positive",
            "error_type": "validation",
        }
    else:
        assert error_of(response, 400)["param"] == named


@pytest.mark.parametrize("path", [f"/predictions/{MODEL}", "/invocations", "/v1/completions", "/generate"])
def test_a_native_bad_field_and_cut_json_name_the_field(frontend: InProcessFrontend, path: str):
    cut = frontend.post(path, content=b'{"prompt": "x", "inputs": "x"')
    if path == "/generate":
        assert cut.status_code == 422 and cut.json()["error_type"] == "validation" and "not valid JSON" in cut.text
        return
    assert error_of(cut, 400)["param"] == "body"
    if path != "/v1/completions":
        too_long = frontend.post(path, json={**NATIVE_BODY, "max_new_tokens": 100000})
        assert error_of(too_long, 400)["param"] == "max_new_tokens"


@pytest.mark.parametrize(
    "path", [f"/predictions/{MODEL}", "/invocations", *(path for r in generation_routes() for path in r.paths)]
)
def test_a_body_over_the_limit_is_a_413_in_json(frontend: InProcessFrontend, path: str):
    big = b"x" * (BODY_LIMIT + 1)
    response = frontend.post(path, content=big)  # Content-Length says so: refused before reading
    assert error_of(response, 413)["param"] == "body" and response.headers["connection"] == "close"

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: refused as the bytes pass the limit
        yield big[:1000]
        yield big[1000:]

    assert error_of(frontend.post(path, content=chunked()), 413)["param"] == "body"


# -- /ping, /metrics, SageMaker mode ---------------------------------------------------
def test_ping(frontend: InProcessFrontend):
    response = frontend.get("/ping")
    assert response.status_code == 200 and response.json() == {"status": "Healthy"}


def test_metrics_are_prometheus_text_labelled_by_route(frontend: InProcessFrontend):
    for route in generation_routes():
        frontend.post(f"/{route.name}", json={**SAMPLES[route.name][1], "stream": False})
    frontend.post(frontend.predictions_path, json=NATIVE_BODY)
    response = frontend.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    for label in [route.label for route in generation_routes()] + ["predictions"]:
        assert f'route="{label}"' in response.text, label


def test_sagemaker_mode_opens_ping_and_invocations_only(sagemaker_frontend: InProcessFrontend):
    served = sagemaker_frontend
    assert served.get("/ping", auth=False).status_code == 200
    whole = served.post("/invocations", auth=False, json={**NATIVE_BODY, "stream": False})
    assert whole_text("native", whole)
    for query, content_type in (("", "text/plain"), ("?model_name=model", "application/json")):
        plain = served.post(
            f"/invocations{query}", auth=False, content=PROMPT.encode(), headers={"Content-Type": content_type}
        )
        assert plain.headers["content-type"] == "application/x-ndjson" and ndjson(plain.text)[-1]["finish_reason"]
    bad = served.post("/invocations", auth=False, content=b"\xff\xfe")
    assert error_of(bad, 400)["param"] == "body"
    openai = served.post(
        "/invocations", auth=False, json={**SAMPLES["v1/completions"][1], "model": "model", "stream": True}
    )
    assert streamed_text("openai", openai)
    for method, path in (("GET", "/v1/models"), ("POST", "/predictions/model"), ("GET", "/metrics")):
        assert error_of(served.request(method, path, auth=False), 401)["type"] == "authentication_error"
