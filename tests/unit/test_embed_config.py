"""`handler.task: embed` in model-config.yaml (handler/config.py): classic batching, an encoder backend
(hf, neuronx, auto), no generation sections, strict buckets; the shipped embed configs parse."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from handler.config import ServingConfig
from handler.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
BASE = {"batchSize": 8, "maxBatchDelay": 5, "handler": {"task": "embed", "model_checkpoint_dir": "model"}}


def test_the_shipped_embedding_config_parses():
    config = ServingConfig.from_model_yaml(yaml.safe_load((REPO / "configs" / "model-config-embed.yaml").read_text()))
    assert config.handler.task == "embed" and config.handler.backend == "hf"
    assert config.batch_size == 8 and config.handler.embed.max_inputs >= 1
    assert config.job_queue_size is not None and 2 * config.batch_size <= config.job_queue_size <= 4 * config.batch_size


def test_the_task_defaults_to_generate():
    config = ServingConfig.from_model_yaml({"handler": {"model_checkpoint_dir": "m"}, "scheduler": {"mode": "static"}})
    assert config.handler.task == "generate"


def test_embed_settings_are_read():
    raw = {**BASE, "handler": {**BASE["handler"], "embed": {"max_inputs": 3, "encode_batch_size": 2}}}
    embed = ServingConfig.from_model_yaml(raw).handler.embed
    assert (embed.max_inputs, embed.encode_batch_size) == (3, 2)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"continuousBatching": True}, "no stream"),
        ({"scheduler": {"mode": "static"}}, "scheduler: applies to handler.task generate"),
        ({"micro_batching": {"micro_batch_size": 2}}, "micro_batching: applies"),
        ({"handler": {**BASE["handler"], "backend": "nxdi"}}, "'nxdi' cannot serve handler.task embed.*neuronx"),
        ({"handler": {**BASE["handler"], "backend": "sim"}}, "'sim' cannot serve handler.task embed"),
        ({"handler": {**BASE["handler"], "backend": "neuronx", "tp_degree": 2}}, "handler.tp_degree: 2"),
        (
            {"handler": {**BASE["handler"], "backend": "neuronx", "neuronx": {"model_class": "LlamaForSampling"}}},
            "handler.neuronx.model_class: configures transformers-neuronx's LLM",
        ),
        (
            {"handler": {**BASE["handler"], "embed": {"buckets": {"batch_sizes": [8, 1]}}}},
            "handler.embed.buckets.batch_sizes.*strictly increasing",
        ),
        (
            {"handler": {**BASE["handler"], "embed": {"buckets": {"seq_lengths": [0, 128]}}}},
            "handler.embed.buckets.seq_lengths.*positive",
        ),
        ({"handler": {**BASE["handler"], "embed": {"buckets": {"batch_sizes": []}}}}, "batch_sizes"),
        ({"handler": {**BASE["handler"], "embed": {"buckets": {"sizes": [1]}}}}, "buckets.sizes: unknown key"),
        ({"handler": {**BASE["handler"], "task": "rerank"}}, "handler.task"),
        ({"handler": {**BASE["handler"], "embed": {"max_inputs": 0}}}, "handler.embed.max_inputs"),
        ({"handler": {**BASE["handler"], "embed": {"typo": 1}}}, "handler.embed.typo: unknown key"),
        ({"maxBatchDelay": 0}, "maxBatchDelay"),
        ({"batchSize": 0}, "batchSize"),
    ],
)
def test_what_an_embedding_archive_cannot_use_is_refused(change, match):
    with pytest.raises(ConfigError, match=match):
        ServingConfig.from_model_yaml({**BASE, **change})


def test_the_shipped_inferentia2_embedding_config_parses():
    raw = yaml.safe_load((REPO / "configs" / "model-config-embed-inf2.yaml").read_text())
    config = ServingConfig.from_model_yaml(raw)
    assert config.handler.task == "embed" and config.handler.backend == "neuronx"
    buckets = config.handler.embed.buckets
    assert buckets.batch_sizes == [1, 8] and buckets.seq_lengths == [128, 256]
    # one worker per NeuronCore (docs/embeddings.md): the workers fill the configured cores exactly
    assert raw["minWorkers"] == raw["maxWorkers"] == config.handler.neuronx.num_cores


@pytest.mark.parametrize("backend", ["neuronx", "auto"])
def test_an_encoder_may_run_on_neuronx_or_auto(backend):
    raw = {**BASE, "handler": {**BASE["handler"], "backend": backend, "neuronx": {"compile_on_start": False}}}
    config = ServingConfig.from_model_yaml(raw)
    assert config.handler.backend == backend and config.handler.neuronx.compile_on_start is False
    assert config.handler.embed.buckets.batch_sizes == [1, 8] and config.handler.embed.buckets.seq_lengths is None
