"""An embedding archive (configs/model-config-embed.yaml, `handler.task: embed`) with the real
all-MiniLM-L6-v2 (`make model`) in a real torchserve, one server for the module: the unmodified
`openai` client's `embeddings.create` (float, base64 and its default, which asks for base64 and
decodes it), parity with the same checkpoint in-process (by hand and with sentence-transformers'
own `encode`), LangChain's `OpenAIEmbeddings` (Python 3.11+, as langchain-openai), SageMaker's
/invocations, the errors. The tests on `served`/`any_client` run against both frontends: TorchServe and
the ASGI frontend (`python -m handler.frontend`, its own batcher; tests/support/asgi_frontend.py)."""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
import yaml

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.asgi_frontend import ASGI, AsgiFrontend, start_asgi_frontend
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[2]
MINILM_DIR = REPO / "models" / "all-minilm-l6-v2"
MODEL = "minilm"
DIMENSION = 384
TEXTS = [
    "The weather is lovely today.",
    "It's so sunny outside!",
    "He drove to the stadium.",
    "Embeddings turn text into vectors that a search index can compare.",
]
# Parity texts: non-ASCII (accents, CJK, emoji, RTL) and long ones, up to the model's 256 tokens
# (sentence-transformers truncates longer inputs, this server refuses them: a longer text has no common answer)
PARITY_TEXTS = [
    *TEXTS,
    "Grüße aus München: das Frühstück war außergewöhnlich gut, çà et là, naïve café.",
    "東京は日本の首都です。 Привет, мир! مرحبا بالعالم 🙂🚀",
    "retrieval augmented generation " * 60,  # 182 tokens
    " ".join(
        f"sentence {i} of a long document about serving embeddings next to a chat model." for i in range(13)
    ),  # 236 tokens
]

pytestmark = pytest.mark.both_frontends


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    """`make test` runs `make model` first; missing is a failure that says how to get it, never a skip."""
    if not (MINILM_DIR / "model.safetensors").is_file():
        pytest.fail(f"{MINILM_DIR} is missing: run `make model` (make test does)")
    return MINILM_DIR


def embed_config() -> dict[str, Any]:
    config = yaml.safe_load((REPO / "configs" / "model-config-embed.yaml").read_text())
    config["handler"]["embed"]["max_inputs"] = 8
    config["maxBatchDelay"] = 50
    return config


@pytest.fixture(scope="module")
def server(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    ts = start_torchserve(tmp_path_factory.mktemp("torchserve-embed"), minilm_dir, embed_config(), model_name=MODEL)
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="module")
def asgi_server(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsgiFrontend]:
    frontend = start_asgi_frontend(tmp_path_factory.mktemp("asgi-embed"), minilm_dir, embed_config(), model_name=MODEL)
    try:
        yield frontend
    finally:
        frontend.stop()


@pytest.fixture(scope="module", params=("torchserve", ASGI))
def served(request: pytest.FixtureRequest) -> TorchServe | AsgiFrontend:
    """The same embedding archive on either frontend."""
    return request.getfixturevalue("server" if request.param == "torchserve" else "asgi_server")


def openai_client(server: TorchServe | AsgiFrontend) -> openai.OpenAI:
    key = server.headers.get("Authorization", "Bearer no-token-auth").removeprefix("Bearer ")
    return openai.OpenAI(base_url=f"{server.predictions_url}/1.0/v1", api_key=key, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def client(server: TorchServe) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="module")
def any_client(served: TorchServe | AsgiFrontend) -> openai.OpenAI:
    return openai_client(served)


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> Any:
    """sentence-transformers' recipe for this checkpoint, by hand: each text alone through transformers'
    AutoModel, mean pooling over its tokens, L2 normalisation."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_dir, local_files_only=True)
    model = AutoModel.from_pretrained(minilm_dir, local_files_only=True).eval()

    def embed(text: str) -> tuple[np.ndarray, int]:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**encoded).last_hidden_state
        return torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0].numpy(), encoded["input_ids"].shape[1]

    return embed


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_openai_client_float_vectors_match_the_checkpoint_in_process(any_client: openai.OpenAI, reference):
    response = any_client.embeddings.create(model=MODEL, input=TEXTS, encoding_format="float")
    assert response.model == MODEL and [d.index for d in response.data] == list(range(len(TEXTS)))
    expected_tokens = 0
    for text, item in zip(TEXTS, response.data, strict=True):
        vector, tokens = reference(text)
        expected_tokens += tokens
        assert len(item.embedding) == DIMENSION
        assert cosine(item.embedding, vector) >= 0.9999
    assert response.usage.prompt_tokens == response.usage.total_tokens == expected_tokens
    # the model's meaning survives serving: the two weather sentences are nearer than weather and stadium
    vectors = [d.embedding for d in response.data]
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_openai_client_base64_decodes_to_the_float_vectors(any_client: openai.OpenAI):
    floats = any_client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="float")
    raw = any_client.embeddings.create(model=MODEL, input=TEXTS[:2], encoding_format="base64")
    default = any_client.embeddings.create(model=MODEL, input=TEXTS[:2])  # the client asks for base64 and decodes it
    for f, r, d in zip(floats.data, raw.data, default.data, strict=True):
        assert isinstance(r.embedding, str)
        decoded = np.frombuffer(base64.b64decode(r.embedding), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(f.embedding, dtype=np.float32))
        assert np.array_equal(np.asarray(d.embedding, dtype=np.float32), decoded)


def test_concurrent_requests_with_a_bad_one_each_get_their_own_answer(any_client: openai.OpenAI, reference):
    def one(i: int) -> Any:
        try:
            if i == 2:
                return any_client.embeddings.create(model=MODEL, input=["fine", ""])
            return any_client.embeddings.create(model=MODEL, input=TEXTS[i], encoding_format="float")
        except openai.APIStatusError as exc:
            return exc

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    bad = results[2]
    assert isinstance(bad, openai.BadRequestError) and bad.body["param"] == "input[1]"
    for i in (0, 1, 3):
        assert cosine(results[i].data[0].embedding, reference(TEXTS[i])[0]) >= 0.9999


def test_token_id_input_and_the_refusals(client: openai.OpenAI, reference):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(MINILM_DIR, local_files_only=True)(TEXTS[0])["input_ids"]
    by_ids = client.embeddings.create(model=MODEL, input=[ids], encoding_format="float")
    assert cosine(by_ids.data[0].embedding, reference(TEXTS[0])[0]) >= 0.9999
    errors = {}
    for kwargs, param in (
        ({"input": "x", "extra_body": {"max_tokens": 8}}, "max_tokens"),
        ({"input": "x", "dimensions": 128}, "dimensions"),
        ({"input": ["x"] * 9}, "input"),
        ({"input": "word " * 300}, "input"),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            client.embeddings.create(model=MODEL, **kwargs)
        assert caught.value.body["param"] == param, caught.value.body
        errors[param] = caught.value.body["message"]
    assert "handler.task: generate" in errors["max_tokens"]
    assert "at most 256 tokens" in errors["input"]
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}])
    assert "handler.task: generate" in chat.value.body["message"]


def test_sagemaker_invocations_and_the_native_route(served: TorchServe | AsgiFrontend, reference):
    server = served
    invocations = httpx.post(
        f"{server.url}/invocations", json={"inputs": TEXTS[:2]}, headers=server.headers, timeout=60
    )
    assert invocations.status_code == 200, invocations.text
    vectors = invocations.json()
    assert len(vectors) == 2 and all(len(v) == DIMENSION for v in vectors)
    assert cosine(vectors[1], reference(TEXTS[1])[0]) >= 0.9999
    native = httpx.post(server.predictions_url, json={"input": TEXTS[3]}, headers=server.headers, timeout=60)
    assert native.status_code == 200 and native.json()["object"] == "list"
    assert cosine(native.json()["data"][0]["embedding"], reference(TEXTS[3])[0]) >= 0.9999
    # a generation route on an embedding server: the same 400 on both frontends
    openai_url = f"{server.predictions_url}/1.0/v1"
    chat = httpx.post(
        f"{openai_url}/chat/completions", json={"model": MODEL, "messages": []}, headers=server.headers, timeout=60
    )
    assert chat.status_code == 400 and "handler.task: generate" in chat.text, chat.text
    if isinstance(server, AsgiFrontend) or has_secure_defaults():  # TorchServe 0.11 passes no url_path
        models = httpx.get(f"{openai_url}/models", headers=server.headers, timeout=60)
        assert models.status_code == 200 and [m["id"] for m in models.json()["data"]] == [MODEL], models.text


@pytest.mark.skipif(
    not has_secure_defaults(), reason="TorchServe 0.11 passes no url_path, and a GET has no body to recognise"
)
def test_openai_client_lists_the_model(client: openai.OpenAI):
    assert [m.id for m in client.models.list()] == [MODEL]


@pytest.fixture(scope="module")
def sentence_transformer(minilm_dir: Path) -> Any:
    """sentence-transformers' own model of the checkpoint, in-process (requirements-dev.txt pins it)."""
    sentence_transformers = pytest.importorskip("sentence_transformers", reason="requirements-dev.txt installs it")
    return sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu", local_files_only=True)


def test_served_vectors_match_sentence_transformers_encode(client: openai.OpenAI, sentence_transformer):
    """Parity with the library that defines this checkpoint's embeddings: cosine >= 0.9999 for every text,
    float and base64 (8 texts: the fixture's max_inputs)."""
    assert sentence_transformer.max_seq_length == 256  # the parity texts stay within it (see PARITY_TEXTS)
    expected = sentence_transformer.encode(PARITY_TEXTS, convert_to_numpy=True, normalize_embeddings=False)
    tokenizer = sentence_transformer.tokenizer
    assert max(len(tokenizer(text)["input_ids"]) for text in PARITY_TEXTS) <= 256
    floats = client.embeddings.create(model=MODEL, input=PARITY_TEXTS, encoding_format="float")
    raw = client.embeddings.create(model=MODEL, input=PARITY_TEXTS, encoding_format="base64")
    served = {
        "float": np.asarray([d.embedding for d in floats.data], dtype=np.float32),
        "base64": np.stack([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in raw.data]),
    }
    for vectors in served.values():
        assert vectors.shape == expected.shape
        cosines = [cosine(v, e) for v, e in zip(vectors, expected, strict=True)]
        assert min(cosines) >= 0.9999, cosines
        assert float(np.abs(vectors - expected).max()) < 1e-4


def _langchain_embeddings(server: TorchServe, **kwargs: Any) -> Any:
    langchain_openai = pytest.importorskip(
        "langchain_openai", reason="langchain-openai is installed on Python 3.11+ only (requirements-dev.txt)"
    )
    key = server.headers.get("Authorization", "Bearer no-token-auth").removeprefix("Bearer ")
    return langchain_openai.OpenAIEmbeddings(
        model=MODEL, base_url=f"{server.predictions_url}/1.0/v1", api_key=key, max_retries=0, timeout=60, **kwargs
    )


def test_langchain_openai_embeddings_with_text_inputs(server: TorchServe, client: openai.OpenAI, reference):
    """What docs/embeddings.md tells LangChain users: `check_embedding_ctx_length=False` sends the texts
    themselves; `chunk_size` at most the archive's handler.embed.max_inputs (8 here) splits 10 texts in two
    requests. Same vectors as the openai client and the checkpoint in-process."""
    embeddings = _langchain_embeddings(server, check_embedding_ctx_length=False, chunk_size=8)
    texts = PARITY_TEXTS + TEXTS[:2]
    documents = embeddings.embed_documents(texts)
    query = embeddings.embed_query(TEXTS[0])
    direct = client.embeddings.create(model=MODEL, input=PARITY_TEXTS, encoding_format="float").data
    assert len(documents) == len(texts) and all(len(v) == DIMENSION for v in documents)
    for vector, item in zip(documents, direct, strict=False):
        assert cosine(vector, item.embedding) >= 0.99999
    assert cosine(documents[0], query) >= 0.99999
    assert cosine(query, reference(TEXTS[0])[0]) >= 0.9999


def test_langchain_openai_embeddings_with_the_models_own_tokenizer(
    server: TorchServe, minilm_dir: Path, client: openai.OpenAI
):
    """`tiktoken_enabled=False` with `tiktoken_model_name` naming the checkpoint's folder: LangChain splits
    each text with the model's own tokenizer into chunks of `embedding_ctx_length` tokens, sends the chunks
    as text (decoded: a chunk that starts inside a word starts with '##', two more tokens when the server
    tokenizes it again, hence 250, not 254) and averages a long text's chunks. Offline; a text over the
    model's 256 tokens is embedded (where plain text would be a 400)."""
    embeddings = _langchain_embeddings(
        server, tiktoken_enabled=False, tiktoken_model_name=str(minilm_dir), embedding_ctx_length=250, chunk_size=8
    )
    long_text = "a long document about serving embeddings. " * 80  # 800 tokens: four chunks
    short, long = embeddings.embed_documents([TEXTS[3], long_text])
    direct = client.embeddings.create(model=MODEL, input=TEXTS[3], encoding_format="float").data[0]
    assert cosine(short, direct.embedding) >= 0.9999  # the chunk is the text lowercased and re-joined
    assert len(long) == DIMENSION and abs(float(np.linalg.norm(long)) - 1) < 1e-4
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input=long_text)


def test_langchain_openai_embeddings_default_needs_tiktoken_files_and_fails_before_any_request(
    server: TorchServe, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """LangChain's default (`check_embedding_ctx_length=True`) tokenizes with tiktoken's cl100k_base, whose
    file it downloads: offline (an empty tiktoken cache, no route out) it raises before sending anything.
    Online it would send cl100k ids, which this BERT model reads as other words: docs/embeddings.md."""
    requests = pytest.importorskip("requests", reason="tiktoken downloads with requests")
    sent: list[httpx.Request] = []
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken"))
    with socket.socket() as closed:  # a port nothing listens on: the "network" tiktoken's download goes to
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{port}")
    with httpx.Client(event_hooks={"request": [sent.append]}) as http:
        embeddings = _langchain_embeddings(server, http_client=http)
        with pytest.raises(requests.exceptions.ConnectionError):
            embeddings.embed_documents(TEXTS[:2])
    assert sent == []
