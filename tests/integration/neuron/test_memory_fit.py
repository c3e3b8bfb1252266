"""The memory-fit check at start (handler/backends/memory_fit.py, issue 22 item 4): neuronx, nxdi
(the fake SDKs) and sim refuse a layout that cannot fit in a NeuronCore's HBM before they load
anything (no SDK import, no core claimed, no tokenizer), with the numbers and what would fit; a
layout that fits is logged with its estimate, one near the limit with a warning. The numbers are
those of tests/unit/test_memory_model.py's arithmetic: Llama-2-70B bf16 at tp_degree 2 holds
64.2 GiB of weights per core."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

import handler.backends.device_slots as device_slots_module
import handler.backends.sim as sim_module
from handler.backends.sim import SimBackend
from handler.config import HandlerConfig
from handler.errors import ConfigError
from handler.inf2_handler import Inf2StreamingHandler
from handler.neuron.memory import Layout, LoraLayout, ModelShape, estimate
from tests.support.bench import sim_model_yaml
from tests.support.neuron import neuronx_yaml, nxdi_yaml
from tests.support.torchserve_harness import load_failure, make_context, run_batch

pytestmark = pytest.mark.filterwarnings("ignore:neuronx_distributed_inference.models.config.get_platform_lnc")

CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "configs"
LLAMA_70B = CONFIGS / "llama-2-70b.json"
LLAMA_7B = CONFIGS / "llama-2-7b.json"
# 70B bf16 at tp 2 with 8 slots x 4096 positions (the 7B profile's batch): the 8 kv heads shard 4 per
# core, KV = 2 x 80 x 4 x 128 x 8 x 4096 x 2 bytes = 5 GiB; weights about 68.98e9 x 2 bytes / 2
SIM_NUMBERS = (
    "llama-2-70b bf16 at tp_degree 2, 8 slot(s) x 4096 positions: 64.2 GiB weights + 5.0 GiB KV + 1.0 GiB "
    "reserve = 70.2 GiB per NeuronCore > 16 GiB HBM; try tp_degree 24"
)


def with_config_of(checkpoint: Path, config: Path) -> Path:
    """The tiny checkpoint (its tokenizer and weights) with another model's config.json."""
    shutil.copy(config, checkpoint / "config.json")
    return checkpoint


@pytest.mark.usefixtures("fake_neuronx")
@pytest.mark.parametrize("backend", ["neuronx", "nxdi"])
def test_a_device_backend_refuses_a_layout_that_cannot_fit_before_it_loads(
    checkpoint, start_backend, tmp_path, backend
):
    model_yaml = (neuronx_yaml if backend == "neuronx" else nxdi_yaml)(
        with_config_of(checkpoint, LLAMA_70B), tp_degree=2, amp="bf16"
    )
    with pytest.raises(ConfigError) as info:
        start_backend(model_yaml)
    message = str(info.value)
    # named after the checkpoint's folder; 2 slots x 256 positions: KV 2 x 80 x 4 x 128 x 2 x 256 x 2 = 0.08 GiB
    assert "model bf16 at tp_degree 2, 2 slot(s) x 256 positions: 64.2 GiB weights + 0.1 GiB KV" in message
    assert "> 16 GiB HBM; try tp_degree 12" in message  # 12.6 + 0.1 + 1 GiB there
    assert f"backend {backend}: this layout does not fit" in message and "handler.tp_degree" in message
    assert f"handler.{backend}.memory_check: false" in message  # how to skip it
    sdk = "transformers_neuronx" if backend == "neuronx" else "neuronx_distributed_inference"
    assert sdk not in sys.modules  # refused before the SDK was imported ...
    locks = tmp_path / "core-locks"
    assert not locks.exists() or not any(locks.iterdir())  # ... and before a core was claimed


class Checked(Exception):
    """Raised by a stand-in for check_memory_fit, once it has seen the layout (nothing further loads)."""


@pytest.mark.usefixtures("fake_neuronx")
def test_the_configured_layout_is_what_is_checked(checkpoint, start_backend, monkeypatch):
    """70B at tp 12, 4 slots x 4096: 17.3 GiB in bf16 (the unit test's arithmetic), refused; with the s8
    weight quantization the check sees int8 weights (and the GQA setting), which fit."""
    model_yaml = neuronx_yaml(
        with_config_of(checkpoint, LLAMA_70B), n_slots=4, tp_degree=12, amp="bf16", n_positions=4096
    )
    model_yaml["handler"]["neuronx"]["num_cores"] = 12
    with pytest.raises(ConfigError, match=r"17\.3 GiB per NeuronCore > 16 GiB HBM; try tp_degree 24 or n_slots 2"):
        start_backend(model_yaml)

    seen: list[Any] = []

    def spy(backend: str, config_path: Path, layout: Any, required: bool = False) -> None:
        seen.append(layout)
        assert estimate(ModelShape.from_path(config_path), layout).fits
        raise Checked

    monkeypatch.setattr(device_slots_module, "check_memory_fit", spy)
    model_yaml["handler"]["neuronx"].update(quantize_weights="s8", group_query_attention="replicated-heads")
    with pytest.raises(Checked):
        start_backend(model_yaml)
    assert seen == [Layout(12, 4, 4096, "int8", "bf16", gqa="replicated-heads", sdk="neuronx")]


@pytest.mark.usefixtures("fake_neuronx")
@pytest.mark.parametrize(("dynamic", "places"), [(False, 4), (True, 3)])
def test_nxdi_checks_the_device_memory_of_its_lora_adapters(checkpoint, monkeypatch, dynamic, places):
    """3 adapters with max_loras 2 and rank 32: the check (before the adapters are even read) sees every
    adapter and the base adapter in device memory, or with dynamic multi-LoRA max_loras and the base."""
    from handler.backends.loader import nxdi_lora
    from handler.backends.nxdi import NxdiBackend
    from handler.config import ServingConfig

    seen: list[Any] = []

    def spy(backend: str, config_path: Path, layout: Any, required: bool = False) -> None:
        seen.append(layout)
        raise Checked

    monkeypatch.setattr(device_slots_module, "check_memory_fit", spy)
    nxdi = {"dynamic_multi_lora": True, "save_sharded_checkpoint": False} if dynamic else {}
    model_yaml = nxdi_yaml(checkpoint, amp="bf16", nxdi=nxdi)
    adapters = {name: f"adapters/{name}" for name in ("a", "b", "c")}
    model_yaml["handler"]["lora"] = {"adapters": adapters, "max_loras": 2, "max_lora_rank": 32}
    config = ServingConfig.from_model_yaml(model_yaml)
    with pytest.raises(Checked):
        NxdiBackend(config, checkpoint, lora=nxdi_lora(config, checkpoint))
    assert seen == [Layout(1, 2, 256, "bf16", "bf16", sdk="nxdi", lora=LoraLayout(places, 32))]


@pytest.mark.usefixtures("fake_neuronx")
def test_a_layout_that_fits_logs_its_estimate_and_memory_check_false_skips_it(
    checkpoint, start_backend, monkeypatch, caplog
):
    with caplog.at_level(logging.INFO, logger="handler.backends.memory_fit"):
        start_backend(neuronx_yaml(checkpoint), warmup=False)
    assert "neuronx: memory check: model f32 at tp_degree 1, 2 slot(s) x 256 positions:" in caplog.text
    assert "<= 16 GiB HBM" in caplog.text

    def refuse(*args: Any) -> None:
        raise AssertionError("the check ran")

    monkeypatch.setattr(device_slots_module, "check_memory_fit", refuse)
    start_backend(neuronx_yaml(checkpoint, neuronx={"memory_check": False}), warmup=False)


@pytest.mark.usefixtures("fake_neuronx")
def test_a_config_the_memory_model_cannot_read_skips_the_check_with_a_warning(checkpoint, start_backend, caplog):
    """A mixture of experts (or a GPT-2-style config without the Llama keys) is not refused: the
    backend starts, and the log says why nothing was checked."""
    config = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**config, "num_local_experts": 8}))
    with caplog.at_level(logging.WARNING, logger="handler.backends.memory_fit"):
        start_backend(neuronx_yaml(checkpoint), warmup=False)
    assert "neuronx: memory check skipped: " in caplog.text and "a mixture of 8 experts" in caplog.text


def sim_config(model_dir: Path, model_config: Path, tp_degree: int) -> dict[str, Any]:
    """The 7B profile (8 slots, 4096 positions) simulating the model of `model_config` in bf16."""
    raw = sim_model_yaml(model_dir, hf_config=str(model_config))
    raw["handler"].update(tp_degree=tp_degree, amp="bf16")
    return raw


def test_sim_with_a_70b_config_at_a_tiny_tp_is_refused_before_anything_loads(tmp_path, monkeypatch):
    def no_tokenizer(*args: Any) -> None:
        raise AssertionError("the tokenizer was loaded")

    monkeypatch.setattr(sim_module, "load_tokenizer", no_tokenizer)
    config = HandlerConfig.model_validate(sim_config(tmp_path, LLAMA_70B, tp_degree=2)["handler"])
    with pytest.raises(ConfigError) as info:
        SimBackend(config, tmp_path, None)
    assert SIM_NUMBERS in str(info.value)
    assert "remove handler.sim.hf_config" in str(info.value)


def test_sim_warns_near_the_limit(tiny_model_dir, caplog):
    """7B at tp 2 with 8 slots x 4096: 6.28 + 8 + 1 = 15.28 GiB, within 5 % of 16: it starts, with a warning."""
    config = HandlerConfig.model_validate(sim_config(tiny_model_dir, LLAMA_7B, tp_degree=2)["handler"])
    with caplog.at_level(logging.WARNING, logger="handler.backends.memory_fit"):
        backend = SimBackend(config, tiny_model_dir, None)
    backend.close()
    assert "sim: memory check: llama-2-7b bf16 at tp_degree 2, 8 slot(s) x 4096 positions" in caplog.text
    assert "15.3 GiB per NeuronCore <= 16 GiB HBM, within 5 % of the limit" in caplog.text


def test_the_worker_answers_with_the_numbers(tiny_model_dir):
    """Through the handler, as TorchServe runs it: the start fails, and every request is answered 503
    with the cause, numbers included (tests/e2e/test_memory_fit.py does it with `make serve`)."""
    handler = Inf2StreamingHandler()
    context = make_context(sim_config(tiny_model_dir, LLAMA_70B, tp_degree=2), str(tiny_model_dir))
    try:
        cause = load_failure(handler, context)
        assert cause.startswith("ConfigError: model-config.yaml: backend sim: this layout does not fit")
        assert SIM_NUMBERS in cause
        (reply,) = run_batch(handler, context, [{"prompt": "hi", "max_new_tokens": 4}])
        assert reply.status == 503 and SIM_NUMBERS in reply.final
    finally:
        handler.shutdown()
