"""Issue 43, item 5: LoRA adapters loaded and unloaded while serving (`handler.lora.runtime_updates`,
vLLM's `/v1/load_lora_adapter` and `/v1/unload_lora_adapter`), through both frontends: a loaded
adapter serves exactly what the same adapter configured at start serves; an unloaded one is refused to
new requests at once while its running request ends whole, and the backend forgets it only after that;
each refusal names its field; with the switch off the routes are a 404."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from handler.frontend.model import ServedModel
from handler.inf2_handler import Inf2StreamingHandler
from tests.integration.lora.conftest import lora_config
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process
from tests.support.torchserve_harness import ContinuousFrontend, make_context

PROMPT = "The capital of France is"
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"


def completion(model: str | None, max_tokens: int = 8) -> dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    return body if model is None else {**body, "model": model}


def updates_config(model_dir: Path, adapters: dict[str, Path], on: bool = True) -> dict[str, Any]:
    config = lora_config(model_dir, {"sql": adapters["sql"]})
    config["handler"]["lora"]["runtime_updates"] = on
    return config


def forgotten(backend: Any, name: str, timeout_s: float = 10.0) -> bool:
    """Whether the backend forgot the adapter: the engine's first step after its last sequence does it."""
    deadline = time.monotonic() + timeout_s
    while name in backend.adapters and time.monotonic() < deadline:
        time.sleep(0.05)
    return name not in backend.adapters


class Frontend:
    """One request at a time, the same way for both frontends: (status, decoded JSON body)."""

    def __init__(self, post: Callable[[str, dict[str, Any]], tuple[int, Any]], backend: Any) -> None:
        self.post = post
        self.backend = backend

    def text(self, model: str | None) -> str:
        status, body = self.post("/v1/completions", completion(model))
        assert status == 200, body
        return body["choices"][0]["text"]

    def models(self) -> list[str]:
        status, body = self.post("/v1/models", {})
        assert status == 200, body
        return [card["id"] for card in body["data"]]


@pytest.fixture(scope="module")
def asgi(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[InProcessFrontend]:
    with running_in_process(ServedModel(updates_config(tiny_model_dir, adapters), tiny_model_dir)) as served:
        yield served


@pytest.fixture(scope="module")
def torchserve(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[ContinuousFrontend]:
    config = updates_config(tiny_model_dir, adapters)
    config["scheduler"]["overlap"] = False  # steps only within calls: a request is mid-generation when the test says
    handler = Inf2StreamingHandler()
    context = make_context(config, str(tiny_model_dir))
    handler.initialize(context)
    yield ContinuousFrontend(handler, context, batch_size=8)
    handler.shutdown()


def asgi_frontend(asgi: InProcessFrontend) -> Frontend:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        response = asgi.get(path) if path == "/v1/models" else asgi.post(path, json=body)
        return response.status_code, response.json()

    assert isinstance(asgi.model, ServedModel) and asgi.model.core is not None
    return Frontend(post, asgi.model.core.backend)


def torchserve_frontend(frontend: ContinuousFrontend) -> Frontend:
    def post(path: str, body: dict[str, Any]) -> tuple[int, Any]:
        reply = frontend.serve([body], [{"url_path": path.lstrip("/")}])[0]
        return reply.status, json.loads(reply.body)

    return Frontend(post, frontend.handler.serving.engine.backend)


@pytest.fixture(params=["asgi", "torchserve"])
def served(request: pytest.FixtureRequest) -> Frontend:
    if request.param == "asgi":
        return asgi_frontend(request.getfixturevalue("asgi"))
    return torchserve_frontend(request.getfixturevalue("torchserve"))


def test_a_loaded_adapter_serves_what_it_serves_when_configured_and_unloads(served: Frontend, adapters):
    status, body = served.post(LOAD, {"lora_name": "sql-again", "lora_path": str(adapters["sql"])})
    base, *_ = served.models()
    assert (status, body) == (200, {"object": "lora_adapter", "id": "sql-again", "parent": base, "status": "loaded"})
    assert "sql-again" in served.models()
    assert served.text("sql-again") == served.text("sql") != served.text(None)

    status, body = served.post(UNLOAD, {"lora_name": "sql-again"})
    assert status == 200 and body["status"] == "unloaded"
    assert "sql-again" not in served.models()
    status, body = served.post("/v1/completions", completion("sql-again"))
    assert status == 404 and body["error"]["param"] == "model"
    assert forgotten(served.backend, "sql-again")
    # Loaded again under the same name: served again.
    assert served.post(LOAD, {"lora_name": "sql-again", "lora_path": str(adapters["chat"])})[0] == 200
    assert served.text("sql-again") != served.text("sql")
    assert served.post(UNLOAD, {"lora_name": "sql-again"})[0] == 200


@pytest.mark.parametrize(
    ("route", "body", "status", "param"),
    [
        (LOAD, {"lora_name": "sql", "lora_path": "{sql}"}, 400, "lora_name"),  # already loaded
        (LOAD, {"lora_name": "{base}", "lora_path": "{sql}"}, 400, "lora_name"),  # the base model's name
        (LOAD, {"lora_name": "x", "lora_path": "/no/such/folder"}, 400, "lora_path"),
        (LOAD, {"lora_name": "x", "lora_path": "{model}"}, 400, "lora_path"),  # a model, not an adapter
        (LOAD, {"lora_name": "x y", "lora_path": "{sql}"}, 400, "lora_name"),
        (LOAD, {"lora_name": "x"}, 400, "lora_path"),
        (LOAD, {"lora_name": "x", "lora_path": "{sql}", "load_inplace": True}, 400, "load_inplace"),
        (UNLOAD, {"lora_name": "never-loaded"}, 404, "lora_name"),
        (UNLOAD, {}, 400, "lora_name"),
    ],
)
def test_each_refusal_names_its_field_and_serving_goes_on(
    served: Frontend, adapters, tiny_model_dir, route, body, status, param
):
    base, *_ = served.models()
    filled = {
        k: v.format(sql=adapters["sql"], model=tiny_model_dir, base=base) if isinstance(v, str) else v
        for k, v in body.items()
    }
    got, answer = served.post(route, filled)
    assert (got, answer["error"]["param"]) == (status, param), answer
    assert served.models() == [base, "sql"]
    assert served.text("sql") != served.text(None)


def test_torchserve_unloading_an_adapter_in_use_lets_its_stream_end_whole(torchserve, adapters):
    frontend = torchserve
    served = torchserve_frontend(frontend)
    assert served.post(LOAD, {"lora_name": "legal", "lora_path": str(adapters["legal"])})[0] == 200
    solo = served.text("legal")
    running = frontend.submit(completion("legal", max_tokens=24), {"url_path": "v1/completions"})
    for _ in range(3):
        frontend.call()
    unload = frontend.submit({"lora_name": "legal"}, {"url_path": "v1/unload_lora_adapter"})
    frontend.call()
    assert frontend.replies[unload].status == 200
    assert "legal" in served.backend.adapters  # its stream still runs with it
    refused = frontend.submit(completion("legal"), {"url_path": "v1/completions"})
    frontend.run()
    assert frontend.replies[refused].status == 404
    text = json.loads(frontend.replies[running].body)["choices"][0]["text"]
    assert text.startswith(solo) and len(text) > len(solo)  # 24 tokens, the first 8 as alone
    assert forgotten(served.backend, "legal")


@pytest.mark.parametrize("frontend", ["asgi", "torchserve"])
def test_the_routes_are_a_404_when_runtime_updates_are_off(frontend, tiny_model_dir, adapters):
    config = updates_config(tiny_model_dir, adapters, on=False)
    if frontend == "asgi":
        with running_in_process(ServedModel(config, tiny_model_dir)) as asgi:
            response = asgi.post(LOAD, json={"lora_name": "x", "lora_path": str(adapters["chat"])})
            status, body = response.status_code, response.json()
    else:
        handler = Inf2StreamingHandler()
        context = make_context(config, str(tiny_model_dir))
        handler.initialize(context)
        try:
            reply = ContinuousFrontend(handler, context).serve(
                [{"lora_name": "x"}], [{"url_path": "v1/unload_lora_adapter"}]
            )[0]
            status, body = reply.status, json.loads(reply.body)
        finally:
            handler.shutdown()
    assert status == 404 and body["error"]["param"] == "url_path"
    assert "runtime_updates" in body["error"]["message"]


def test_with_replicas_every_replica_loads_it_and_forgets_it(tiny_model_dir, adapters):
    config = updates_config(tiny_model_dir, adapters)
    config["scheduler"]["replicas"] = 2
    with running_in_process(ServedModel(config, tiny_model_dir)) as asgi:
        served = asgi_frontend(asgi)
        assert served.post(LOAD, {"lora_name": "chat", "lora_path": str(adapters["chat"])})[0] == 200
        with ThreadPoolExecutor(4) as pool:  # both replicas get some (fewest sequences first)
            texts = list(pool.map(lambda _: served.text("chat"), range(4)))
        assert len(set(texts)) == 1 and texts[0] != served.text(None)
        assert served.post(UNLOAD, {"lora_name": "chat"})[0] == 200
        status, body = served.post("/v1/completions", completion("chat"))
        assert status == 404 and body["error"]["param"] == "model"
