"""The embedding archive (`handler.task: embed`) driven as TorchServe's worker drives it
(tests/support/torchserve_harness.py): a frontend batch of several requests is encoded together,
each request answered alone; served vectors match a direct transformers computation."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from handler.inf2_handler import Inf2StreamingHandler
from handler.serving.embedding import EmbeddingServing
from tests.support.torchserve_harness import Reply, make_context, run_batch

MAX_INPUTS = 5
TEXTS = ["The weather is nice today.", "a cat", "Tomorrow it may rain over the hills and the sea, they say."]


def embed_config(checkpoint: Path, **embed: Any) -> dict[str, Any]:
    return {
        "batchSize": 8,
        "maxBatchDelay": 5,
        "handler": {
            "task": "embed",
            "model_checkpoint_dir": str(checkpoint),
            "embed": {"max_inputs": MAX_INPUTS, "encode_batch_size": 2, **embed},
        },
    }


@pytest.fixture(scope="module")
def served(tiny_encoder_dir: Path) -> Iterator[tuple[Inf2StreamingHandler, Any]]:
    handler = Inf2StreamingHandler()
    context = make_context(embed_config(tiny_encoder_dir), str(tiny_encoder_dir))
    handler.initialize(context)
    assert isinstance(handler.serving, EmbeddingServing), handler.serving
    try:
        yield handler, context
    finally:
        handler.shutdown()


@pytest.fixture
def call(served):
    def run(*pairs: tuple[str, Any]) -> list[Reply]:
        handler, context = served
        return run_batch(handler, context, [body for _, body in pairs], [{"url_path": route} for route, _ in pairs])

    return run


@pytest.fixture(scope="module")
def reference(tiny_encoder_dir: Path):
    """The checkpoint in-process with plain transformers: each text alone, mean pooling + L2 normalize."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir, local_files_only=True)
    model = AutoModel.from_pretrained(tiny_encoder_dir, local_files_only=True).eval()

    def embed(text: str) -> np.ndarray:
        encoded = tokenizer(text, return_tensors="pt")
        with torch.inference_mode():
            hidden = model(**encoded).last_hidden_state
        return torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0].numpy()

    return embed


def vectors(reply: Reply) -> np.ndarray:
    body = json.loads(reply.final)
    rows = [d["embedding"] for d in body["data"]] if isinstance(body, dict) else body
    return np.array(rows, dtype=np.float32)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_a_batch_with_a_bad_request_answers_the_good_ones(call, reference):
    good, bad, other, too_many = call(
        ("v1/embeddings", {"input": TEXTS, "model": "m"}),
        ("v1/embeddings", {"input": ["fine", ""]}),
        ("", {"inputs": TEXTS[1]}),
        ("v1/embeddings", {"input": ["x"] * (MAX_INPUTS + 1)}),
    )
    assert good.status == 200 and good.content_type == "application/json"
    body = json.loads(good.final)
    assert body["model"] == "m" and [d["index"] for d in body["data"]] == [0, 1, 2]
    for text, served in zip(TEXTS, vectors(good), strict=True):
        assert cosine(served, reference(text)) >= 0.9999
        assert abs(np.linalg.norm(served) - 1.0) < 1e-5
    assert bad.status == 400 and json.loads(bad.final)["error"]["param"] == "input[1]"
    assert other.status == 200 and cosine(vectors(other)[0], reference(TEXTS[1])) >= 0.9999
    assert too_many.status == 400 and json.loads(too_many.final)["error"]["param"] == "input"


def test_usage_counts_every_inputs_tokens(call, tiny_encoder_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir, local_files_only=True)
    (reply,) = call(("v1/embeddings", {"input": TEXTS}))
    expected = sum(len(tokenizer(t)["input_ids"]) for t in TEXTS)
    assert json.loads(reply.final)["usage"] == {"prompt_tokens": expected, "total_tokens": expected}


def test_token_id_inputs_embed_as_their_text_does(call, tiny_encoder_dir):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(tiny_encoder_dir, local_files_only=True)(TEXTS[0])["input_ids"]
    one, many, text = call(
        ("v1/embeddings", {"input": ids}),
        ("v1/embeddings", {"input": [ids, ids[:3]]}),
        ("v1/embeddings", {"input": TEXTS[0]}),
    )
    assert one.status == many.status == text.status == 200
    assert cosine(vectors(one)[0], vectors(text)[0]) >= 0.9999
    assert cosine(vectors(many)[0], vectors(text)[0]) >= 0.9999 and len(vectors(many)) == 2


def test_a_vector_does_not_depend_on_its_batch_mates(call):
    (alone,) = call(("v1/embeddings", {"input": TEXTS[1]}))
    beside = call(("v1/embeddings", {"input": [TEXTS[2], TEXTS[1]]}), ("", {"inputs": TEXTS[0]}))[0]
    assert cosine(vectors(alone)[0], vectors(beside)[1]) >= 0.9999


def test_inputs_past_the_models_length_or_vocabulary_are_a_400_naming_them(call):
    long_text = " ".join(["weather"] * 80)  # max_seq_length is 64
    words = " ".join(f"w{i}" for i in range(4000))  # refused before it is tokenized
    long_text_reply, long_ids, bad_ids, huge = call(
        ("v1/embeddings", {"input": ["fine", long_text]}),
        ("v1/embeddings", {"input": [[2] * 65]}),
        ("v1/embeddings", {"input": [[2, 3], [2, 10**9, 3]]}),
        ("", {"inputs": [words]}),
    )
    for reply, param, words_in_message in (
        (long_text_reply, "input[1]", "at most 64 tokens"),
        (long_ids, "input[0]", "65 tokens"),
        (bad_ids, "input[1]", "outside the model's vocabulary"),
        (huge, "inputs[0]", "longer than this model's 64 tokens"),
    ):
        error = json.loads(reply.final)["error"]
        assert reply.status == 400 and error["param"] == param and words_in_message in error["message"], error


def test_llm_fields_and_routes_are_refused_with_which_archive_serves_what(call):
    field, route, body_shape = call(
        ("v1/embeddings", {"input": "x", "max_tokens": 16}),
        ("v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("", {"prompt": "hi"}),
    )
    for reply, param in ((field, "max_tokens"), (route, "url_path"), (body_shape, "prompt")):
        error = json.loads(reply.final)["error"]
        assert reply.status == 400 and error["param"] == param and "handler.task: generate" in error["message"]


def test_models_listing_and_base64(call):
    listing, encoded, floats = call(
        ("v1/models", None),
        ("v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"}),
        ("v1/embeddings", {"input": TEXTS[0]}),
    )
    assert json.loads(listing.final)["data"][0]["id"] == "m"
    import base64

    decoded = np.frombuffer(base64.b64decode(json.loads(encoded.final)["data"][0]["embedding"]), dtype="float32")
    # two requests, two forward passes: equal up to float32 rounding (a wrong dtype or byte order is far off)
    np.testing.assert_allclose(decoded, vectors(floats)[0], rtol=0, atol=1e-6)


def test_a_body_that_is_not_json_is_its_own_400(call):
    broken, good = call(("v1/embeddings", '{"input": ["a",'), ("v1/embeddings", {"input": "a"}))
    assert broken.status == 400 and json.loads(broken.final)["error"]["param"] == "body"
    assert good.status == 200


def test_a_failing_encoder_fails_its_requests_not_the_worker(served, call, monkeypatch):
    handler, _ = served
    encoder = handler.serving.encoder

    def broken(rows):
        raise RuntimeError("device lost")

    monkeypatch.setattr(encoder, "encode", broken)
    bad, listing = call(("v1/embeddings", {"input": "a"}), ("v1/models", None))
    assert bad.status == 500 and "device lost" in json.loads(bad.final)["error"]["message"]
    assert listing.status == 200
    monkeypatch.undo()
    (again,) = call(("v1/embeddings", {"input": "a"}))
    assert again.status == 200


def test_a_draining_worker_refuses_new_requests_and_marks_itself_drained(tiny_encoder_dir, tmp_path, monkeypatch):
    from handler.serving.state import ENV_VAR, drained_marker, write_drain

    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    handler = Inf2StreamingHandler()
    context = make_context(embed_config(tiny_encoder_dir), str(tiny_encoder_dir))
    handler.initialize(context)
    watcher = handler.serving.drain
    watcher.stop()  # polled by hand below
    try:
        (before,) = run_batch(handler, context, [{"input": "a"}])
        assert before.status == 200
        write_drain(tmp_path, grace_s=600)
        for _ in range(10):
            watcher.poll()
        openai_late, native_late = run_batch(handler, context, [{"input": "a"}, {"inputs": "b"}])
        for reply in (openai_late, native_late):
            assert reply.status == 503 and "draining" in json.loads(reply.final)["error"]["message"]
        assert drained_marker(tmp_path).exists()
    finally:
        handler.shutdown()


def test_an_encoder_that_fails_to_load_answers_503_naming_the_cause(tmp_path):
    from tests.support.torchserve_harness import load_failure

    (tmp_path / "modules.json").write_text('[{"idx": 0, "type": "sentence_transformers.models.Dense"}]')
    handler = Inf2StreamingHandler()
    context = make_context(embed_config(tmp_path), str(tmp_path))
    cause = load_failure(handler, context)
    try:
        assert "Dense" in cause
        (reply,) = run_batch(handler, context, [{"input": "a"}], [{"url_path": "v1/embeddings"}])
        error = json.loads(reply.final)["error"]
        assert reply.status == 503 and error["type"] == "model_load_failed" and "Dense" in error["message"]
    finally:
        handler.shutdown()
