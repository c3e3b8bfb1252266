"""What sagemaker-archive and sagemaker-upload say about a SageMaker model-config.yaml, and
the shipped SageMaker config and container properties themselves."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from handler.config import ServingConfig
from scripts.sagemaker.common import (
    LOAD_SAFE_TIMEOUT_S,
    REPO,
    SAGEMAKER_MODEL_CONFIG,
    SAGEMAKER_PROPERTIES,
    config_findings,
    read_properties,
)

NXDI_MODEL_CONFIG = REPO / "configs" / "model-config-sagemaker-inf2-nxdi.yaml"

GOOD: dict[str, Any] = {
    "responseTimeout": 1200,
    "startupTimeout": 1200,
    "handler": {"model_checkpoint_dir": "model", "backend": "neuronx", "neuronx": {"compile_on_start": False}},
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A checkpoint with compiled artifacts where the neuronx backend looks (neuron_cache/artifacts)."""
    artifacts = tmp_path / "model" / "neuron_cache" / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "manifest.json").write_text("{}")
    return tmp_path / "model"


def with_(**changes: Any) -> dict[str, Any]:
    raw = copy.deepcopy(GOOD)
    for dotted, value in changes.items():
        *parents, key = dotted.split("__")
        node = raw
        for parent in parents:
            node = node.setdefault(parent, {})
        if value is None:
            node.pop(key, None)
        else:
            node[key] = value
    return raw


def test_a_load_safe_sagemaker_config_with_artifacts_has_nothing_to_say(checkpoint):
    found = config_findings(GOOD, checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


def test_a_response_timeout_above_sagemakers_60_s_is_no_longer_a_warning(checkpoint):
    found = config_findings(with_(responseTimeout=3600, startupTimeout=3600), checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


def test_a_short_response_timeout_warns_that_torchserve_0_11_loads_under_it(checkpoint):
    found = config_findings(with_(responseTimeout=55), checkpoint, "cfg")
    (warning,) = found.warnings
    assert "responseTimeout=55s" in warning and "TorchServe 0.11" in warning and "waits for the model load" in warning
    assert found.errors == []


def test_no_startup_timeout_warns_for_torchserve_0_12_images(checkpoint):
    (warning,) = config_findings(with_(startupTimeout=None), checkpoint, "cfg").warnings
    assert "TorchServe 0.12+" in warning and "startupTimeout" in warning


def test_compile_on_start_warns(checkpoint):
    (warning,) = config_findings(with_(handler__neuronx__compile_on_start=True), checkpoint, "cfg").warnings
    assert "compile_on_start is true" in warning


def test_missing_artifacts_fail_when_the_endpoint_may_not_compile(tmp_path):
    found = config_findings(GOOD, tmp_path / "model", "cfg")
    (error,) = found.errors
    assert "no compiled Neuron artifacts" in error and "make compile" in error


def test_missing_artifacts_only_warn_when_the_endpoint_may_compile(tmp_path):
    found = config_findings(with_(handler__neuronx__compile_on_start=True), tmp_path / "model", "cfg")
    assert found.errors == []
    assert any("no compiled Neuron artifacts" in w for w in found.warnings)


def test_an_s3_cache_dir_keeps_artifacts_in_the_checkpoint(checkpoint):
    found = config_findings(with_(handler__neuronx__cache_dir="s3://bucket/cache"), checkpoint, "cfg")
    assert found.errors == []


def nxdi(**changes: Any) -> dict[str, Any]:
    """GOOD for the nxdi backend: its settings in handler.nxdi, none in handler.neuronx."""
    raw = with_(**{"handler__backend": "nxdi", "handler__neuronx": None, **changes})
    raw["handler"].setdefault("nxdi", {}).setdefault("compile_on_start", False)
    return raw


# (backend, section): each device backend's checks read its own section of handler:
DEVICE_BACKENDS = [("neuronx", "neuronx"), ("nxdi", "nxdi")]


def device(backend: str, **settings: Any) -> dict[str, Any]:
    raw = nxdi() if backend == "nxdi" else with_()
    raw["handler"][backend].update(settings)
    return raw


@pytest.mark.parametrize(("backend", "section"), DEVICE_BACKENDS)
def test_a_device_config_with_artifacts_has_nothing_to_say(checkpoint, backend, section):
    found = config_findings(device(backend), checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


@pytest.mark.parametrize(("backend", "section"), DEVICE_BACKENDS)
def test_compile_on_start_warns_naming_the_backends_section(checkpoint, backend, section):
    found = config_findings(device(backend, compile_on_start=True), checkpoint, "cfg")
    (warning,) = found.warnings
    assert f"handler.{section}.compile_on_start is true" in warning
    assert found.errors == []


@pytest.mark.parametrize(("backend", "section"), DEVICE_BACKENDS)
def test_a_cache_dir_outside_the_model_data_fails_when_the_endpoint_may_not_compile(checkpoint, backend, section):
    found = config_findings(device(backend, cache_dir="/mnt/shared/neuron"), checkpoint, "cfg")
    (error,) = found.errors
    assert f"handler.{section}.cache_dir '/mnt/shared/neuron' is outside the model data" in error
    assert "/opt/ml/model" in error and "fail to load" in error


@pytest.mark.parametrize(("backend", "section"), DEVICE_BACKENDS)
def test_a_cache_dir_outside_the_model_data_only_warns_when_the_endpoint_may_compile(checkpoint, backend, section):
    found = config_findings(device(backend, cache_dir="/mnt/shared/neuron", compile_on_start=True), checkpoint, "cfg")
    assert found.errors == []
    assert any(f"handler.{section}.cache_dir '/mnt/shared/neuron' is outside" in w for w in found.warnings)


@pytest.mark.parametrize(("backend", "section"), DEVICE_BACKENDS)
def test_missing_artifacts_fail_naming_the_sdk_of_the_backends_image(tmp_path, backend, section):
    (error,) = config_findings(device(backend), tmp_path / "model", "cfg").errors
    assert "no compiled Neuron artifacts" in error and "make compile" in error
    assert f"the default {section} image runs SDK {'2.28' if backend == 'nxdi' else '2.25'}" in error


def test_the_nxdi_checks_read_handler_nxdi_not_handler_neuronx(checkpoint):
    """The section follows handler.backend: the other backend's section is not looked at."""
    raw = nxdi(handler__neuronx={"compile_on_start": True, "cache_dir": "/elsewhere"})
    found = config_findings(raw, checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])
    raw = with_(handler__nxdi={"compile_on_start": True, "cache_dir": "/elsewhere"})  # backend neuronx
    found = config_findings(raw, checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


def test_nxdi_without_sharded_weights_warns(checkpoint):
    (warning,) = config_findings(nxdi(handler__nxdi__save_sharded_checkpoint=False), checkpoint, "cfg").warnings
    assert "handler.nxdi.save_sharded_checkpoint is false" in warning and "host RAM" in warning


def test_a_cpu_backend_is_pointed_out(checkpoint):
    (warning,) = config_findings(with_(handler__backend="hf"), checkpoint, "cfg").warnings
    assert "CPU" in warning


def test_the_shipped_sagemaker_config_parses_and_is_load_safe(checkpoint):
    raw = yaml.safe_load(SAGEMAKER_MODEL_CONFIG.read_text())
    config = ServingConfig.from_model_yaml(raw)  # the handler's own parser: no unknown keys
    assert config.handler.backend == "neuronx" and config.handler.amp == "bf16" and config.handler.tp_degree == 2
    assert config.handler.neuronx.compile_on_start is False
    assert config.handler.neuronx.compile_cache == "/tmp/neuron-compile-cache"
    assert config.handler.model_checkpoint_dir == "model"
    assert raw["responseTimeout"] >= LOAD_SAFE_TIMEOUT_S and raw["startupTimeout"] >= LOAD_SAFE_TIMEOUT_S
    assert config.micro_batching.micro_batch_size <= config.batch_size
    found = config_findings(raw, checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


def test_the_shipped_nxdi_sagemaker_config_parses_and_is_load_safe(checkpoint):
    raw = yaml.safe_load(NXDI_MODEL_CONFIG.read_text())
    config = ServingConfig.from_model_yaml(raw)
    handler = config.handler
    assert handler.backend == "nxdi" and handler.amp == "bf16" and handler.tp_degree == 2
    assert handler.n_positions == 4096 and handler.model_checkpoint_dir == "model"
    assert handler.nxdi.compile_on_start is False and handler.nxdi.save_sharded_checkpoint is True
    assert handler.nxdi.cache_dir == "neuron_cache" and handler.nxdi.compile_cache == "/tmp/neuron-compile-cache"
    assert handler.nxdi.attn_kernel_enabled is False
    # the longest prompt (the largest context bucket) leaves max_new_tokens of room; decode reaches n_positions
    assert handler.nxdi.context_buckets[-1] + handler.max_new_tokens <= handler.n_positions
    assert handler.nxdi.token_buckets[-1] == handler.n_positions
    # NxDI's load() warms up every bucket: at least the neuronx twin's load time
    twin = yaml.safe_load(SAGEMAKER_MODEL_CONFIG.read_text())
    for key in ("responseTimeout", "startupTimeout"):
        assert raw[key] >= max(LOAD_SAFE_TIMEOUT_S, twin[key]), key
    assert config.scheduler.mode == "continuous" and config.scheduler.n_slots == 4
    found = config_findings(raw, checkpoint, "cfg")
    assert (found.errors, found.warnings) == ([], [])


def test_the_nxdi_config_is_the_twin_of_the_neuronx_one():
    """Everything but the backend's own keys is the same serving layout."""
    nxdi_raw = yaml.safe_load(NXDI_MODEL_CONFIG.read_text())
    neuronx_raw = yaml.safe_load(SAGEMAKER_MODEL_CONFIG.read_text())
    for raw in (nxdi_raw, neuronx_raw):
        for key in ("responseTimeout", "startupTimeout"):
            raw.pop(key)
        raw["handler"].pop("n_positions")
    assert nxdi_raw["handler"].pop("nxdi") and neuronx_raw["handler"].pop("neuronx")
    assert nxdi_raw["handler"].pop("backend") == "nxdi" and neuronx_raw["handler"].pop("backend") == "neuronx"
    assert nxdi_raw == neuronx_raw


def test_the_container_properties():
    props = {p.key: p.value for p in read_properties(SAGEMAKER_PROPERTIES)}
    assert props["inference_address"] == "http://0.0.0.0:8080"
    assert props["management_address"].startswith("http://127.0.0.1:")
    assert props["disable_token_authorization"] == "true" and props["enable_model_api"] == "false"
    assert props["allowed_urls"] == "file:///opt/ml/model/.*"
    assert props["install_py_dep_per_model"] == "false"  # the deps are bundled in the archive
    assert props["decode_input_request"] == "false"
    assert props["plugins_path"] == "/opt/ml/model/plugins"  # the readiness /ping, in the archive
    assert int(props["default_response_timeout"]) >= LOAD_SAFE_TIMEOUT_S  # TorchServe 0.11 loads under it
