"""The ASGI frontend's embedding batcher (handler/frontend/embedding.py) on a real encoder (the tiny
sentence-transformers checkpoint, handler/core/embedding.py's steps): TorchServe's classic batching
semantics (at most batchSize requests per batch, the rest in the next), a bad request failing alone,
the vectors of a batch the same as each request's alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from handler.config import ServingConfig
from handler.core.embedding import EmbeddingCore, load_warm_encoder
from handler.frontend.body import unless_disconnected
from handler.frontend.embedding import Answer, EmbeddingBatcher
from tests.integration.test_embedding_handler import TEXTS, embed_config

BATCH_SIZE = 4


@pytest.fixture(scope="module")
def core(tiny_encoder_dir: Path) -> Iterator[EmbeddingCore]:
    config = ServingConfig.from_model_yaml(embed_config(tiny_encoder_dir))
    encoder = load_warm_encoder(config, str(tiny_encoder_dir))
    try:
        yield EmbeddingCore(config, encoder)
    finally:
        encoder.close()


def serve(core: EmbeddingCore, requests: list[tuple[str, Any]], batches: list[int]) -> list[Answer]:
    """All `requests` (route, body) submitted at once to a fresh batcher; the size of every batch it ran
    goes to `batches`."""

    async def run() -> list[Answer]:
        batcher = EmbeddingBatcher(core, "tiny", BATCH_SIZE, batch_delay_s=0.05)
        handle = batcher.handle

        def counted(batch: list[Any]) -> list[Answer]:
            batches.append(len(batch))
            return handle(batch)

        batcher.handle = counted  # type: ignore[method-assign]
        batcher.start()
        try:
            jobs = [
                batcher.submit(route, json.dumps(body).encode(), str(i)) for i, (route, body) in enumerate(requests)
            ]
            return await asyncio.gather(*jobs)
        finally:
            await batcher.stop()

    return asyncio.run(run())


def vectors(answer: Answer) -> np.ndarray:
    assert answer.status == 200, answer.body
    return np.asarray([d["embedding"] for d in json.loads(answer.body)["data"]], dtype=np.float32)


def test_at_most_batch_size_requests_go_together_and_a_bad_one_fails_alone(core: EmbeddingCore):
    requests: list[tuple[str, Any]] = [("v1/embeddings", {"model": "tiny", "input": text}) for text in TEXTS * 2]
    requests.insert(2, ("v1/embeddings", {"model": "tiny", "input": ["fine", ""]}))
    batches: list[int] = []
    answers = serve(core, requests, batches)
    assert batches == [BATCH_SIZE, len(requests) - BATCH_SIZE]
    bad = answers.pop(2)
    assert bad.status == 400 and json.loads(bad.body)["error"]["param"] == "input[1]"
    alone = [vectors(serve(core, [request], [])[0]) for request in requests[:2] + requests[3:]]
    for answer, expected in zip(answers, alone, strict=True):
        np.testing.assert_allclose(vectors(answer), expected, atol=1e-5)


def test_feature_extraction_the_model_listing_and_a_generation_route(core: EmbeddingCore):
    batches: list[int] = []
    features, models, chat = serve(
        core, [("", {"inputs": TEXTS[:2]}), ("v1/models", None), ("v1/chat/completions", {"messages": []})], batches
    )
    assert features.status == 200 and np.asarray(json.loads(features.body)).shape == (2, core.encoder.dimension)
    assert models.status == 200 and [m["id"] for m in json.loads(models.body)["data"]] == ["tiny"]
    assert chat.status == 400 and "handler.task: generate" in chat.body
    assert batches == [3]


def test_a_request_whose_client_left_while_queued_is_not_encoded(core: EmbeddingCore):
    """handler/frontend/body.py's unless_disconnected around submit, as the app calls it: the client
    of the first request disconnects while it waits for company; its batch holds only the other."""

    async def run() -> tuple[Answer | None, Answer | None, list[int]]:
        batches: list[int] = []
        batcher = EmbeddingBatcher(core, "tiny", BATCH_SIZE, batch_delay_s=0.3)
        handle = batcher.handle
        batcher.handle = lambda batch: batches.append(len(batch)) or handle(batch)  # type: ignore[method-assign]
        batcher.start()
        left = asyncio.Event()

        async def receive() -> dict[str, Any]:  # the ASGI receive of a client that leaves
            await left.wait()
            return {"type": "http.disconnect"}

        async def staying() -> dict[str, Any]:
            await asyncio.Event().wait()
            return {}

        body = json.dumps({"model": "tiny", "input": TEXTS[0]}).encode()
        try:
            gone = asyncio.ensure_future(unless_disconnected(receive, batcher.submit("v1/embeddings", body, "a")))
            kept = asyncio.ensure_future(unless_disconnected(staying, batcher.submit("v1/embeddings", body, "b")))
            await asyncio.sleep(0.05)
            left.set()
            return await gone, await kept, batches
        finally:
            await batcher.stop()

    gone, kept, batches = asyncio.run(run())
    assert gone is None
    assert kept is not None and vectors(kept).shape == (1, core.encoder.dimension)
    assert batches == [1]
