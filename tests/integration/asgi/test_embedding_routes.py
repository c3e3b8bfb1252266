"""An embedding archive's routes on the ASGI frontend in-process (the tiny sentence-transformers
encoder): the table's embedding routes at each of their paths, the unnamed routes by the body's
shape, the generation routes refused with what serves them, and the refusals in JSON."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.api.routes import ROUTES
from handler.frontend.embedding import ServedEmbedder
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process

MODEL = "tiny"
TEXTS = ["The weather is nice today.", "a cat"]


@pytest.fixture(scope="module")
def embedder(tiny_encoder_dir: Path) -> Iterator[InProcessFrontend]:
    config = {
        "batchSize": 4,
        "maxBatchDelay": 5,
        "handler": {"task": "embed", "model_checkpoint_dir": str(tiny_encoder_dir), "embed": {"max_inputs": 4}},
    }
    with running_in_process(ServedEmbedder(config, tiny_encoder_dir, MODEL), model_name=MODEL) as served:
        yield served


def vectors(body: dict[str, Any]) -> list[list[float]]:
    assert body["object"] == "list" and body["model"] == MODEL, body
    return [item["embedding"] for item in body["data"]]


@pytest.mark.parametrize(
    "path",
    [
        path
        for route in ROUTES
        if "embed" in route.tasks and route.body
        for path in (*route.paths, f"/predictions/{MODEL}/1.0/{route.name}")
    ],
)
def test_the_embedding_routes_answer(embedder: InProcessFrontend, path: str):
    response = embedder.post(path, json={"model": MODEL, "input": TEXTS, "encoding_format": "float"})
    assert response.status_code == 200, response.text
    found = vectors(response.json())
    assert len(found) == len(TEXTS) and len({len(v) for v in found}) == 1
    bad = embedder.post(path, json={"model": MODEL, "input": ["fine", ""]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1]"


def test_without_a_route_the_body_shape_picks_openai_or_feature_extraction(embedder: InProcessFrontend):
    for path in (f"/predictions/{MODEL}", "/invocations"):
        openai = embedder.post(path, json={"input": TEXTS[0]})
        assert openai.status_code == 200 and len(vectors(openai.json())) == 1
        features = embedder.post(path, json={"inputs": TEXTS})
        assert features.status_code == 200 and len(features.json()) == len(TEXTS)


@pytest.mark.parametrize("prefix", ["", f"/predictions/{MODEL}/1.0"])
def test_the_model_listing(embedder: InProcessFrontend, prefix: str):
    listing = embedder.get(f"{prefix}/v1/models")
    assert listing.status_code == 200 and [m["id"] for m in listing.json()["data"]] == [MODEL]


def test_the_generation_routes_say_which_archive_serves_them(embedder: InProcessFrontend):
    for route in ROUTES:
        if "embed" in route.tasks:
            continue
        for path in (*route.paths, f"/predictions/{MODEL}/1.0/{route.name}"):
            response = embedder.post(path, json={"model": MODEL, "prompt": "x", "inputs": "x"})
            assert response.status_code == 400, (path, response.text)
            assert "handler.task: generate" in response.text, path


def test_refusals(embedder: InProcessFrontend):
    assert embedder.post("/v1/embeddings", auth=False, json={"input": "x"}).status_code == 401
    assert embedder.get("/v1/embeddings").status_code == 405
    assert embedder.post("/v1/nowhere", json={"input": "x"}).status_code == 404
    assert embedder.get("/ping").json() == {"status": "Healthy"}
    assert 'route="v1/embeddings"' in embedder.get("/metrics").text
