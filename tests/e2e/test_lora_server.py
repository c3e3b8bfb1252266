"""LoRA adapters (issue 43, docs/lora.md) through real servers: one torchserve (continuous, token auth on)
and one ASGI frontend (`python -m handler.frontend`, uvicorn), each serving the tiny model with the adapters
"a" and "b" of tests/support/lora.py, each started once for the module. The unmodified clients pick an
adapter: the `openai` client by `model`, huggingface_hub's `InferenceClient` by TGI's `adapter_id`; the text
is PEFT's own greedy output with that adapter in this process (tests/integration/test_hf_lora.py's
`peft_generate`), not the base model's; `/v1/models` lists both adapters under the base; streams of the base
and both adapters at once each give their solo text. The in-process matrix (the native `adapter`,
`max_loras` waits, one step's rows) is tests/integration/lora/ and tests/integration/test_hf_lora.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.e2e.conftest import E2E_MODEL_CONFIG
from tests.support.asgi_frontend import ASGI, AsgiFrontend
from tests.support.lora import peft_generate, tiny_lora_adapters
from tests.support.modes import with_mode
from tests.support.openai import one_server, openai_url, server_key
from tests.support.streaming import timed
from tests.support.tgi import _hub_online
from tests.support.torchserve_process import TorchServe

__all__ = ["_hub_online", "tiny_lora_adapters"]

pytestmark = pytest.mark.both_frontends  # and the ASGI frontend (tests/e2e/conftest.py)

PROMPT = "The capital of France is"
ADAPTERS = ("a", "b")
NAMES = (None, *ADAPTERS)  # None: the base model
N_TOKENS = 8  # what each client asks for
N_SLOTS = 6  # every stream of the mixed test runs at once
LONG_TOKENS = 128  # the mixed test's streams: long enough to overlap on a busy machine


def lora_config(adapters: dict[str, Path]) -> dict[str, Any]:
    """The e2e tiny-model config, continuous (LoRA needs it), with both adapters; TGI's format for an
    `inputs` body that names no route (TorchServe 0.11 passes none)."""
    config = with_mode(E2E_MODEL_CONFIG, "continuous", n_slots=N_SLOTS)
    config["handler"] = {
        **config["handler"],
        "n_positions": 256,
        "max_new_tokens": 128,
        "no_route_api": "tgi",
        "lora": {"adapters": {name: str(path) for name, path in adapters.items()}},
    }
    return config


@pytest.fixture(scope="module", params=("torchserve", ASGI))
def served(
    request: pytest.FixtureRequest,
    tiny_model_dir: Path,
    tiny_lora_adapters: dict[str, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[TorchServe | AsgiFrontend]:
    """One server at a time: the torchserve, stopped, then the ASGI frontend."""
    workdir = tmp_path_factory.mktemp("lora")
    with one_server(request.param, workdir, tiny_model_dir, lora_config(tiny_lora_adapters)) as server:
        yield server


@pytest.fixture(scope="module")
def reference(tiny_model_dir: Path, tiny_lora_adapters: dict[str, Path], tiny_tokenizer) -> Callable[..., str]:
    """reference(name, n): the first n greedy tokens' text for PROMPT, computed in this process: transformers'
    generate on the base model (name None), PEFT's `PeftModel` with the adapter otherwise. EOS is never
    chosen (min_new_tokens, as the OpenAI requests' ignore_eos), so one long run gives every shorter one.
    InferenceClient cannot send ignore_eos, but on this prompt greedy picks no EOS in its N_TOKENS tokens, with
    or without an adapter (the tiny model and the adapters come from fixed seeds)."""
    prompt = tuple(tiny_tokenizer(PROMPT)["input_ids"])
    ids = {name: peft_generate(tiny_model_dir, tiny_lora_adapters[name], prompt, LONG_TOKENS) for name in ADAPTERS}
    ids[None] = peft_generate(tiny_model_dir, None, prompt, LONG_TOKENS)
    texts = {name: tiny_tokenizer.decode(ids[name][:N_TOKENS], skip_special_tokens=True) for name in NAMES}
    assert len(set(texts.values())) == len(NAMES), texts  # each adapter changes the greedy text

    def text(name: str | None, n: int = N_TOKENS) -> str:
        return tiny_tokenizer.decode(ids[name][:n], skip_special_tokens=True)

    return text


def openai_client(server: TorchServe | AsgiFrontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_url(server), api_key=server_key(server), max_retries=0, timeout=60)


def tgi_client(server: TorchServe | AsgiFrontend) -> InferenceClient:
    """huggingface_hub's client on the server's TGI `generate` route (tests/support/tgi.py)."""
    return InferenceClient(base_url=f"{server.predictions_url}/1.0/generate", api_key=server_key(server), timeout=60)


def completion(client: openai.OpenAI, model: str, n: int = N_TOKENS, **extra: Any) -> Any:
    """A greedy completion of PROMPT by `model` (the base's name or an adapter's)."""
    return client.completions.create(
        model=model, prompt=PROMPT, max_tokens=n, temperature=0, extra_body={"ignore_eos": True}, **extra
    )


# -- the openai client: `model` names the adapter ------------------------------------------------------------
def test_the_openai_client_gets_each_adapters_peft_text_by_model(served, reference):
    client = openai_client(served)
    for name in ADAPTERS:
        reply = completion(client, name)
        assert reply.model == name
        assert reply.choices[0].text == reference(name)
        assert reply.choices[0].text != reference(None)
    base = completion(client, served.model_name)
    assert base.model == served.model_name and base.choices[0].text == reference(None)


def test_the_openai_client_chats_with_an_adapter(served):
    client = openai_client(served)
    messages = [{"role": "user", "content": PROMPT}]

    def chat(model: str) -> Any:
        return client.chat.completions.create(model=model, messages=messages, max_tokens=N_TOKENS, temperature=0)

    with_a, base = chat("a"), chat(served.model_name)
    assert with_a.model == "a" and base.model == served.model_name
    assert with_a.choices[0].message.content != base.choices[0].message.content
    stream = client.chat.completions.create(
        model="a", messages=messages, max_tokens=N_TOKENS, temperature=0, stream=True
    )
    chunks = list(stream)
    assert {chunk.model for chunk in chunks} == {"a"}
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert streamed == with_a.choices[0].message.content


def skip_unless_routed(server: TorchServe | AsgiFrontend) -> None:
    """TorchServe 0.11 passes no url_path: a body is routed by its shape, so any `model` is served as it is
    (SageMaker's convention, handler/api/common.py served_model) and a GET has no route at all."""
    if isinstance(server, TorchServe) and not has_secure_defaults():
        pytest.skip("TorchServe 0.11 passes no url_path to the handler")


def test_an_unknown_model_is_the_openai_clients_not_found_naming_model(served):
    skip_unless_routed(served)
    with pytest.raises(openai.NotFoundError) as raised:
        completion(openai_client(served), "no-such-adapter", n=2)
    assert raised.value.status_code == 404
    assert raised.value.body["param"] == "model" and raised.value.body["code"] == "model_not_found"


def test_v1_models_lists_the_base_and_each_adapter_with_its_parent(served):
    skip_unless_routed(served)
    listed = openai_client(served).models.list()
    assert [(card.id, getattr(card, "parent", None)) for card in listed.data] == [
        (served.model_name, None),
        ("a", served.model_name),
        ("b", served.model_name),
    ]


# -- huggingface_hub's InferenceClient: TGI's `adapter_id` ---------------------------------------------------
@pytest.mark.parametrize("stream", [False, True])
def test_the_inference_client_gets_each_adapters_peft_text_by_adapter_id(served, reference, stream: bool):
    client = tgi_client(served)

    def text(adapter: str | None) -> str:
        out = client.text_generation(PROMPT, max_new_tokens=N_TOKENS, adapter_id=adapter, stream=stream)
        return "".join(out) if stream else out

    for name in NAMES:
        assert text(name) == reference(name), name


def unknown_adapter_error(server: TorchServe | AsgiFrontend, stream: bool) -> ValidationError:
    """What InferenceClient raises for a request naming an adapter the server does not have."""
    with pytest.raises(ValidationError) as raised:
        out = tgi_client(server).text_generation(PROMPT, max_new_tokens=2, adapter_id="no-such-adapter", stream=stream)
        list(out) if stream else None
    return raised.value


@pytest.mark.parametrize("stream", [False, True])
def test_an_unknown_adapter_id_is_a_422_the_inference_client_raises_as_its_validation_error(served, stream: bool):
    error = unknown_adapter_error(served, stream)
    # before any event, so no stream was opened: TGI's status for a validation error (docs/tgi.md#errors)
    assert error.__cause__.response.status_code == 422
    assert "'adapter_id': the adapter 'no-such-adapter' is not served here (adapters: a, b)" in str(error)


def test_the_unknown_adapter_id_error_the_inference_client_sees_names_adapter_id(served):
    assert "adapter_id" in str(unknown_adapter_error(served, stream=False))


# -- many streams at once ------------------------------------------------------------------------------------
def test_streams_of_the_base_and_both_adapters_at_once_each_give_their_solo_text(served, reference):
    """Six streams sent together (as many as the server has slots), the base, a and b twice each, so the
    decode steps mix base rows and rows of two adapters: each text is its own reference, and the streams
    overlapped (every first piece came before any stream's last). The openai client's: InferenceClient
    cannot send ignore_eos, and within LONG_TOKENS the base model picks EOS."""
    client = openai_client(served)
    names = NAMES * 2
    start = threading.Barrier(len(names))

    def run(name: str | None) -> tuple[list[float], str]:
        start.wait(timeout=30)
        chunks = completion(client, name or served.model_name, n=LONG_TOKENS, stream=True)
        arrivals = list(timed(chunk.choices[0].text for chunk in chunks if chunk.choices))
        return [at for at, _ in arrivals], "".join(piece for _, piece in arrivals)

    begun = time.perf_counter()
    with ThreadPoolExecutor(len(names)) as pool:
        results = list(pool.map(run, names))
    wrong = [
        (name, text) for name, (_, text) in zip(names, results, strict=True) if text != reference(name, LONG_TOKENS)
    ]
    assert wrong == [], {name: reference(name, LONG_TOKENS) for name in NAMES}
    firsts, lasts = [times[0] for times, _ in results], [times[-1] for times, _ in results]
    assert max(firsts) < min(lasts), (
        f"first pieces {[round(t - begun, 3) for t in firsts]} s, last {[round(t - begun, 3) for t in lasts]} s "
        "after the streams were sent: one stream ended before another began"
    )
