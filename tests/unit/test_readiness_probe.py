"""The readiness probe (scripts/serve/client.py) asks each archive for what it serves: an embedding
archive refuses generation fields, so it is probed with one embedded word; it reads TorchServe's
key file even while TorchServe is still writing it."""

from __future__ import annotations

import json
import threading

import pytest

from handler.api import select_api, select_embedding_api
from handler.api.embeddings import FeatureExtractionApi
from scripts.serve import client
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


def test_a_key_file_caught_mid_write_is_read_again(tmp_path):
    """TorchServe creates key_file.json, then writes it: `make serve`'s readiness poll once read it
    empty and died on the JSON error (CI, 2026-12-05). A read in between waits for the content."""
    key_file = tmp_path / "key_file.json"
    key_file.write_text("")
    keys = {"management": {"key": "m"}, "inference": {"key": "the-key"}, "API": {"key": "a"}}
    threading.Timer(0.2, key_file.write_text, args=(json.dumps(keys),)).start()
    assert client.inference_key(key_file, management_url=None) == "the-key"
    key_file.write_text("{")
    with pytest.raises(json.JSONDecodeError):
        client._read_keys(key_file, attempts=3, pause_s=0.01)  # a file that stays broken is an error
