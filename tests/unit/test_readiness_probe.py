"""The readiness probe (scripts/serve/client.py) asks each archive for what it serves: an embedding
archive refuses generation fields, so it is probed with one embedded word."""

from __future__ import annotations

from handler.api import select_api, select_embedding_api
from handler.api.embeddings import FeatureExtractionApi
from scripts.serve.client import readiness_body, task_of


def test_the_probe_follows_the_configs_task(tmp_path):
    embed, generate, unset = tmp_path / "e.yaml", tmp_path / "g.yaml", tmp_path / "u.yaml"
    embed.write_text("handler:\n  task: embed\n  model_checkpoint_dir: m\n")
    generate.write_text("handler:\n  task: generate\n  model_checkpoint_dir: m\n")
    unset.write_text("handler:\n  model_checkpoint_dir: m\n")
    assert [task_of(p) for p in (embed, generate, unset, None, tmp_path / "missing.yaml")] == [
        "embed",
        "generate",
        "generate",
        "generate",
        "generate",
    ]


def test_each_probe_is_a_request_its_archive_serves():
    embed_api = select_embedding_api(None, "m", 4, readiness_body("embed"))
    assert isinstance(embed_api, FeatureExtractionApi)
    assert embed_api.parse(readiness_body("embed"), 1).inputs == ("ping",)
    assert select_api(None, "m", readiness_body("generate")).name == "native"
