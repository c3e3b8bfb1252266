"""make checkpoint (scripts/model/prepare_checkpoint.py) and make compile (scripts/model/compile.py)
with the fake SDK."""

from __future__ import annotations

import importlib
import os
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from tests.support.neuron import calls, neuronx_yaml

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.usefixtures("fake_neuronx")


def script(name: str):
    return importlib.import_module(f"scripts.model.{name}")


def logits_of(path: Path) -> torch.Tensor:
    """The prefill logits of one prompt, through the fake SDK as the backend builds it (continuous batching).
    Its compile cache is the test's (fake_neuronx restores the environment afterwards)."""
    from transformers_neuronx import ContinuousBatchingConfig, LlamaForSampling, NeuronConfig

    os.environ["NEURON_COMPILE_CACHE_URL"] = str(path.parent / "compile-cache")
    neuron_config = NeuronConfig(continuous_batching=ContinuousBatchingConfig(max_num_seqs=1))
    model = LlamaForSampling.from_pretrained(
        str(path),
        batch_size=1,
        tp_degree=1,
        n_positions=128,
        context_length_estimate=[128],
        neuron_config=neuron_config,
    )
    model.to_neuron()
    return model.forward(torch.tensor([[5, 6, 7, 8]]), cache_ids=torch.arange(4)[None], start_ids=torch.tensor([0]))


def test_safetensors_checkpoint_is_copied_and_loads_directly(tiny_model_dir, tmp_path, fake_neuronx):
    target = tmp_path / "prepared"
    script("prepare_checkpoint").main([str(tiny_model_dir), str(target)])
    assert (target / "model.safetensors").is_file() and (target / "tokenizer.json").is_file()
    assert torch.allclose(logits_of(target), logits_of(tiny_model_dir), atol=1e-5)


def test_bin_checkpoint_is_converted_to_safetensors(tiny_model_dir, tmp_path):
    from safetensors.torch import load_file

    source = tmp_path / "bin-model"
    shutil.copytree(tiny_model_dir, source)
    torch.save(load_file(source / "model.safetensors"), source / "pytorch_model.bin")
    (source / "model.safetensors").unlink()
    target = tmp_path / "prepared"
    script("prepare_checkpoint").main([str(source), str(target)])
    assert (target / "model.safetensors").is_file() and not (target / "pytorch_model.bin").exists()
    assert torch.allclose(logits_of(target), logits_of(tiny_model_dir), atol=1e-5)


def test_split_checkpoint_for_older_releases(tiny_model_dir, tmp_path, fake_neuronx):
    target = tmp_path / "split"
    script("prepare_checkpoint").main([str(tiny_model_dir), str(target), "--format", "split"])
    assert (target / "pytorch_model.bin" / "key_to_filename.json").is_file()
    assert [c["directory"] for c in calls(fake_neuronx, "save_pretrained_split")] == [str(target)]
    assert torch.allclose(logits_of(target), logits_of(tiny_model_dir), atol=1e-5)


def test_compile_script_precompiles_so_the_server_only_loads(checkpoint, tmp_path, fake_neuronx, start_backend):
    config = tmp_path / "model-config.yaml"
    model_yaml = neuronx_yaml(checkpoint)
    config.write_text(yaml.safe_dump(model_yaml))
    assert script("compile").main(["--model-dir", str(checkpoint), "--config", str(config)]) == "compile"
    assert (checkpoint / "neuron_cache" / "artifacts" / "manifest.json").is_file()
    assert script("compile").main(["--model-dir", str(checkpoint), "--config", str(config), "--no-warmup"]) == "load"

    assert start_backend(model_yaml).path_taken == "load"
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "load", "load"]


def test_compile_script_traces_an_embedding_config_so_the_server_only_loads(tiny_encoder_dir, tmp_path, fake_neuronx):
    """make compile MODEL_CONFIG=<an embed config>: every bucket traced into <checkpoint>/neuron_cache/artifacts,
    then a worker with compile_on_start false loads them (no trace)."""
    from handler.backends.loader import load_encoder
    from handler.config import ServingConfig

    checkpoint = Path(shutil.copytree(tiny_encoder_dir, tmp_path / "encoder"))
    model_yaml = yaml.safe_load((REPO / "configs" / "model-config-embed-inf2.yaml").read_text())
    model_yaml["handler"]["embed"]["buckets"]["seq_lengths"] = [16, 64]  # the tiny encoder reads 64 tokens
    config = tmp_path / "model-config.yaml"
    config.write_text(yaml.safe_dump(model_yaml))
    assert script("compile").main(["--model-dir", str(checkpoint), "--config", str(config)]) == "compile"
    artifacts = checkpoint / "neuron_cache" / "artifacts"
    assert sorted(p.name for p in artifacts.glob("*.pt")) == [
        "encoder_b1_s16.pt",
        "encoder_b1_s64.pt",
        "encoder_b8_s16.pt",
        "encoder_b8_s64.pt",
    ]
    assert script("compile").main(["--model-dir", str(checkpoint), "--config", str(config), "--no-warmup"]) == "load"
    assert len(calls(fake_neuronx, "trace")) == 4

    model_yaml["handler"]["model_checkpoint_dir"] = str(checkpoint)
    model_yaml["handler"]["neuronx"]["compile_on_start"] = False
    encoder = load_encoder(ServingConfig.from_model_yaml(model_yaml), None)
    try:
        assert encoder.path_taken == "load" and encoder.encode([[2, 5, 3]]).shape == (1, encoder.dimension)
    finally:
        encoder.close()
    assert len(calls(fake_neuronx, "trace")) == 4
