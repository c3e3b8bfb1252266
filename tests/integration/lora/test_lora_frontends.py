"""Issue 43 through both frontends: a request picks its adapter by OpenAI's `model`, the native
`adapter` or TGI's `adapter_id`; one step mixing base rows and rows of different adapters gives each
row exactly what it gets alone; a third adapter requested at once (max_loras 2) waits and is served;
`/v1/models` lists the adapters with their parent; an unknown adapter is refused naming its field."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.support.asgi_inprocess import BASE_URL, InProcessFrontend
from tests.support.torchserve_harness import ContinuousFrontend

PROMPT = "The capital of France is"
NAMES = (None, "sql", "chat", "legal")  # None: the base model


def completion(model: str | None) -> dict:
    """A greedy completion; with no `model`, the base model."""
    body = {"prompt": PROMPT, "max_tokens": 12, "ignore_eos": True, "temperature": 0}
    return body if model is None else {**body, "model": model}


# -- the ASGI frontend -----------------------------------------------------------------------
def asgi_text(asgi: InProcessFrontend, model: str | None) -> str:
    response = asgi.post("/v1/completions", json=completion(model))
    assert response.status_code == 200, response.text
    assert response.json()["model"] == (model or "llama")
    return response.json()["choices"][0]["text"]


def test_asgi_each_adapter_changes_the_output_and_a_mixed_batch_gives_each_row_its_solo_text(asgi):
    alone = {name: asgi_text(asgi, name) for name in NAMES}
    assert len(set(alone.values())) == len(NAMES)  # each adapter really changes the greedy text
    with ThreadPoolExecutor(len(NAMES) * 2) as pool:  # base, sql, chat, legal twice over: mixed steps
        together = list(pool.map(lambda name: (name, asgi_text(asgi, name)), NAMES * 2))
    assert [(name, text) for name, text in together if text != alone[name]] == [], alone


def test_asgi_the_openai_client_selects_an_adapter_by_model(asgi):
    client = openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=asgi.key, http_client=asgi.client)

    async def listing():
        return await client.models.list()

    listed = asgi.run(listing())
    assert [(m.id, getattr(m, "parent", None)) for m in listed.data] == [
        ("llama", None),
        ("chat", "llama"),
        ("legal", "llama"),
        ("sql", "llama"),
    ]
    reply = asgi.run(
        client.completions.create(
            model="sql", prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
    )
    assert reply.model == "sql" and reply.choices[0].text == asgi_text(asgi, "sql")
    with pytest.raises(openai.NotFoundError):
        asgi.run(client.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=2))


def test_asgi_native_and_tgi_fields_select_the_adapter(asgi):
    native = asgi.post(
        asgi.predictions_path,
        json={"prompt": PROMPT, "max_new_tokens": 12, "ignore_eos": True, "stream": False, "adapter": "chat"},
    )
    assert native.status_code == 200 and native.json()["text"] == asgi_text(asgi, "chat")
    tgi = asgi.post("/generate", json={"inputs": PROMPT, "parameters": {"max_new_tokens": 12, "adapter_id": "legal"}})
    assert tgi.status_code == 200, tgi.text
    unknown = asgi.post(asgi.predictions_path, json={"prompt": PROMPT, "adapter": "nope", "stream": False})
    assert unknown.status_code == 400 and unknown.json()["error"]["param"] == "adapter"


# -- the TorchServe adapter --------------------------------------------------------------------
def ts_text(reply) -> str:
    assert reply.status == 200, reply.body
    return json.loads(reply.body)["choices"][0]["text"]


def test_torchserve_a_mixed_batch_gives_each_row_its_solo_text_and_a_third_adapter_waits(torchserve_handler):
    handler, context = torchserve_handler
    frontend = ContinuousFrontend(handler, context, batch_size=8)
    headers = {"url_path": "v1/completions"}
    alone = {name: ts_text(frontend.serve([completion(name)], [headers])[0]) for name in NAMES}
    live_per_step: list[int] = []
    scheduler = handler.serving.engine.scheduler
    ids = [frontend.submit(completion(name), headers) for name in NAMES * 2]
    while frontend.busy:
        frontend.call()
        live_per_step.append(len(scheduler.live_adapters))
    assert max(live_per_step) == 2  # never three adapters in one step: the third waited
    for request_id, name in zip(ids, NAMES * 2, strict=True):
        assert ts_text(frontend.replies[request_id]) == alone[name]
