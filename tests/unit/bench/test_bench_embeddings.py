"""`make bench-embed`'s arithmetic and what it reads: the worker's batch log line (as the embedding
adapter writes it), the ratios, the served archives' configs."""

import re
from pathlib import Path

import pytest

from handler.config import ServingConfig
from scripts.bench.embeddings import BATCH, BATCH_LINE, CLIENTS, LoadResult, model_config, ratios

REPO = Path(__file__).resolve().parents[3]


def test_the_batch_line_matches_what_the_embedding_adapter_logs():
    source = (REPO / "handler" / "core" / "embedding.py").read_text()
    found = re.search(r'"(embedding batch: [^"]*)",', source)
    assert found, "handler/core/embedding.py no longer logs its batches as scripts/bench/embeddings.py reads them"
    line = found.group(1) % (8, 8, 1024, 41.25)
    assert BATCH_LINE.findall(f"2026-12-05 MODEL_LOG - {line}") == [("8", "8", "41.2")]


def load(name: str, per_s: float) -> LoadResult:
    return LoadResult(name, BATCH, CLIENTS, "float", 100, 0, per_s, 10.0, 20.0)


def test_ratios_are_served_over_in_process_at_the_same_batch():
    loads = [
        load(f"batch {BATCH}, {CLIENTS} clients, float", 90.0),
        load(f"batch {BATCH}, {CLIENTS} clients, base64", 95.0),
        load(f"batch 1, {CLIENTS} clients, float", 60.0),
    ]
    reference = {"batch_1": {"embeddings_per_s": 80.0}, f"batch_{BATCH}": {"embeddings_per_s": 100.0}}
    out = ratios(loads, reference)
    assert out["P13"] == pytest.approx(0.9)
    assert out["P13-base64"] == pytest.approx(0.95)
    assert out["P13-batch1"] == pytest.approx(0.75)
    assert out["batching_gain"] == pytest.approx(1.5)
    assert out["in_process_batching_gain"] == pytest.approx(1.25)


@pytest.mark.parametrize("batch_size", [1, BATCH])
def test_the_served_archives_are_the_shipped_config_with_one_thread_and_room_for_every_client(batch_size: int):
    config = model_config(batch_size, 5)
    assert config["batchSize"] == batch_size and config["jobQueueSize"] >= CLIENTS
    serving = ServingConfig.from_model_yaml(config)
    assert serving.handler.task == "embed" and serving.handler.cpu_threads == 1
