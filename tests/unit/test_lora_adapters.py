"""A PEFT adapter folder read and checked against the base model before anything loads it
(handler/lora/adapters.py), and handler.lora's configuration: every refusal names the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.lora.adapters import AdapterError, read_adapter

BASE = {"q_proj": (64, 64), "v_proj": (64, 16), "down_proj": (128, 64)}  # name -> (in, out)
PREFIX = "base_model.model.model.layers.0.self_attn"


def write_adapter(folder: Path, rank: int = 8, shapes: dict[str, tuple[int, int]] | None = None, **config) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shapes = shapes if shapes is not None else {"q_proj": BASE["q_proj"], "v_proj": BASE["v_proj"]}
    tensors = {}
    for module, (in_features, out_features) in shapes.items():
        tensors[f"{PREFIX}.{module}.lora_A.weight"] = torch.zeros(rank, in_features)
        tensors[f"{PREFIX}.{module}.lora_B.weight"] = torch.zeros(out_features, rank)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    body = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": sorted(shapes), **config}
    (folder / "adapter_config.json").write_text(json.dumps(body))
    return folder


def test_a_well_formed_adapter_is_read(tmp_path):
    spec = read_adapter("sql", write_adapter(tmp_path / "sql", base_model_name_or_path="base"), 16, BASE)
    assert (spec.name, spec.rank, spec.alpha, spec.target_modules, spec.base_model) == (
        "sql",
        8,
        16.0,
        ("q_proj", "v_proj"),
        "base",
    )


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d, "is not a folder"),
        (lambda d: (d.mkdir(), d)[1], "adapter_model.safetensors is missing"),
        (lambda d: (d.mkdir(), (d / "adapter_model.bin").write_bytes(b"pickle"), d)[2], "is not safetensors"),
        (lambda d: write_adapter(d, rank=32), "rank 32 is above handler.lora.max_lora_rank (16)"),
        (
            lambda d: write_adapter(d, shapes={"gate_proj": (64, 128)}),
            "targets 'gate_proj', which the base model lacks",
        ),
        (lambda d: write_adapter(d, shapes={"q_proj": (32, 32)}), "does not fit the base model"),
        (lambda d: write_adapter(d, use_dora=True), "use_dora is not served"),
        (lambda d: write_adapter(d, peft_type="IA3"), "is not LORA"),
    ],
    ids=["no-folder", "no-weights", "pickle", "rank", "target", "shapes", "dora", "not-lora"],
)
def test_an_adapter_that_cannot_be_served_is_refused_naming_it(tmp_path, make, words):
    folder = make(tmp_path / "broken")
    with pytest.raises(AdapterError) as refused:
        read_adapter("broken", folder, 16, BASE)
    assert "'broken'" in str(refused.value) and words in str(refused.value)


def config_with(handler_extra: dict, **raw) -> ServingConfig:
    return ServingConfig.from_model_yaml(
        {
            "continuousBatching": True,
            "batchSize": 8,
            "handler": {"model_checkpoint_dir": "model", **handler_extra},
            "scheduler": {"mode": "continuous", "n_slots": 4},
            **raw,
        }
    )


def test_the_lora_section_and_its_defaults():
    config = config_with({"lora": {"adapters": {"sql": "adapters/sql", "chat-v2": "/abs/chat"}}})
    lora = config.handler.lora
    assert lora is not None and (lora.max_loras, lora.max_lora_rank, lora.runtime_updates) == (4, 16, False)
    assert config.max_adapters == 4
    assert config.handler.adapter_paths("/models/llama") == {
        "sql": Path("/models/llama/adapters/sql"),
        "chat-v2": Path("/abs/chat"),
    }
    assert config_with({}).max_adapters is None


@pytest.mark.parametrize(
    ("handler_extra", "raw", "words"),
    [
        ({"lora": {"adapters": {"../x": "p"}}}, {}, "adapter name '../x'"),
        ({"lora": {"max_loras": 0}}, {}, "max_loras"),
        ({"lora": {"adapters": {}, "unknown": 1}}, {}, "unknown"),
        ({"lora": {}, "backend": "neuronx"}, {}, "use backend nxdi"),
        ({"lora": {}}, {"continuousBatching": False, "scheduler": {"mode": "static", "n_slots": 4}}, "continuous"),
    ],
    ids=["name", "max-loras", "unknown-key", "neuronx", "static"],
)
def test_a_lora_section_that_cannot_work_is_refused(handler_extra, raw, words):
    with pytest.raises(ConfigError) as refused:
        config_with(handler_extra, **raw)
    assert words in str(refused.value)
