"""Small pieces without a model: environment, cache location, core placement, auto selection."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from handler.backends.loader import resolve_auto
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.neuron import cores
from handler.neuron.auto import choose_backend
from handler.neuron.environment import CacheLocation, compiler_flags, configure_compiler, pin_cores
from handler.serving.service import worker_of


def test_compiler_flags_keep_the_users_and_add_model_type_once():
    assert compiler_flags("", []) == "--model-type=transformer"
    assert compiler_flags("-O1 --model-type=transformer", ["--enable-fast-loading-neuron-binaries"]) == (
        "-O1 --model-type=transformer --enable-fast-loading-neuron-binaries"
    )
    assert compiler_flags("--model-type=generic", ["-O1", "-O1"]) == "--model-type=generic -O1"


def test_cache_location_default_shared_and_s3(tmp_path):
    default = CacheLocation.resolve("neuron_cache", tmp_path / "model")
    assert default.artifacts_dir == tmp_path / "model/neuron_cache/artifacts"
    assert default.compile_cache_url == str(tmp_path / "model/neuron_cache/compile-cache")
    shared = CacheLocation.resolve("/mnt/efs/llama", tmp_path / "model")
    assert shared.artifacts_dir == Path("/mnt/efs/llama/artifacts")
    s3 = CacheLocation.resolve("s3://bucket/llama/", tmp_path / "model")
    assert s3.compile_cache_url == "s3://bucket/llama/compile-cache"
    assert s3.artifacts_dir == tmp_path / "model/neuron_cache/artifacts"


def test_compile_cache_key_overrides_only_the_compile_cache(tmp_path):
    local = CacheLocation.resolve("neuron_cache", tmp_path / "model", "/tmp/neuron-compile-cache")
    assert local.artifacts_dir == tmp_path / "model/neuron_cache/artifacts"
    assert local.compile_cache_url == "/tmp/neuron-compile-cache"
    s3 = CacheLocation.resolve("/mnt/efs/llama", tmp_path / "model", "s3://bucket/cache")
    assert (s3.artifacts_dir, s3.compile_cache_url) == (Path("/mnt/efs/llama/artifacts"), "s3://bucket/cache")
    both_s3 = CacheLocation.resolve("s3://bucket/llama", tmp_path / "model", "/var/cache/neuron")
    assert both_s3.compile_cache_url == "/var/cache/neuron"


@pytest.mark.parametrize("value", ["compile-cache", "./cache", "~/cache"])
def test_compile_cache_must_be_absolute_or_s3(value):
    raw = {
        "continuousBatching": True,
        "batchSize": 8,
        "handler": {"model_checkpoint_dir": "m", "neuronx": {"compile_cache": value}},
    }
    with pytest.raises(ConfigError, match=r"handler\.neuronx\.compile_cache: .*absolute local path .* or an s3:// URL"):
        ServingConfig.from_model_yaml(raw)


def test_configure_compiler_respects_a_location_the_operator_chose(caplog):
    cache = CacheLocation(Path("/m/artifacts"), "/m/compile-cache")
    env = {"NEURONX_CACHE": "on"}
    with caplog.at_level(logging.WARNING):
        assert configure_compiler([], cache, env).startswith("NEURON_COMPILE_CACHE_URL=/m/compile-cache")
    assert env["NEURON_COMPILE_CACHE_URL"] == "/m/compile-cache" and "no longer reads it" in caplog.text
    env = {"NEURON_CC_FLAGS": "--cache_dir=/shared/cache"}
    assert "--cache_dir=/shared/cache in NEURON_CC_FLAGS" in configure_compiler(["-O1"], cache, env)
    assert "NEURON_COMPILE_CACHE_URL" not in env
    assert env["NEURON_CC_FLAGS"] == "--cache_dir=/shared/cache --model-type=transformer -O1"


def test_pin_cores_replaces_num_cores():
    env = {"NEURON_RT_NUM_CORES": "2"}
    pin_cores("4-7", env)
    assert env == {"NEURON_RT_VISIBLE_CORES": "4-7", "INF2_OPERATOR_VISIBLE_CORES": ""}
    assert cores.operator_cores(env) is None  # our own pin is not the operator's choice


def test_pin_cores_keeps_the_operators_cores_for_the_next_placement():
    env = {"NEURON_RT_VISIBLE_CORES": "2-5"}
    pin_cores("2-3", env)
    pin_cores("4-5", env)
    assert env["NEURON_RT_VISIBLE_CORES"] == "4-5"
    assert cores.operator_cores(env) == [2, 3, 4, 5]


@pytest.mark.parametrize(
    ("text", "parsed", "formatted"),
    [("3", [3], "3"), ("2-3", [2, 3], "2-3"), ("0-1,4-5", [0, 1, 4, 5], "0-1,4-5"), ("1, 0,2", [1, 0, 2], "1,0,2")],
)
def test_visible_core_lists_parse_and_format(text, parsed, formatted):
    assert cores.parse_core_list(text) == parsed
    assert cores.format_core_list(parsed) == formatted


@pytest.mark.parametrize("text", ["a", "3-1", "-2", "1,,2"])
def test_a_malformed_visible_core_list_is_a_clear_error(text):
    with pytest.raises(ConfigError, match="NEURON_RT_VISIBLE_CORES"):
        cores.parse_core_list(text)


def test_workers_are_partitioned_within_the_operators_cores(tmp_path):
    given = cores.parse_core_list("2-3,6-7")
    by_gpu_id = [cores.place(k, 2, 2, given).visible_cores for k in range(2)]
    assert by_gpu_id == ["2-3", "6-7"]
    locked = [cores.place(None, 2, 2, given, lock_dir=tmp_path) for _ in range(2)]
    assert [p.visible_cores for p in locked] == ["2-3", "6-7"]
    with pytest.raises(ConfigError, match="need 6 NeuronCores but 4 are available"):
        cores.place(None, 3, 2, given, lock_dir=tmp_path)


@pytest.mark.parametrize(
    ("instance", "available", "workers", "tp", "ranges"),
    [
        ("inf2.xlarge", 2, 1, 2, ["0-1"]),
        ("inf2.24xlarge", 12, 3, 4, ["0-3", "4-7", "8-11"]),
        ("inf2.48xlarge", 24, 3, 8, ["0-7", "8-15", "16-23"]),
        ("inf2.48xlarge", 24, 12, 2, [f"{2 * i}-{2 * i + 1}" for i in range(12)]),
    ],
)
def test_documented_layouts_place_disjoint_ranges(instance, available, workers, tp, ranges):
    assert [cores.place(k, workers, tp, available).visible_cores for k in range(workers)] == ranges


def test_no_device_is_a_clear_error():
    with pytest.raises(ConfigError, match="no Neuron device found"):
        cores.check_fits(1, 2, 0)


def test_core_detection_counts_devices(tmp_path):
    dev, sys_dir = tmp_path / "dev", tmp_path / "sys"
    dev.mkdir()
    for name in ("neuron0", "neuron1", "neuron_monitor", "null"):
        (dev / name).touch()
    (sys_dir / "neuron1").mkdir(parents=True)
    (sys_dir / "neuron1" / "core_count").write_text("4\n")
    assert cores.detect_cores(dev, sys_dir) == 2 + 4


def test_auto_picks_neuronx_only_with_package_and_device(tmp_path, monkeypatch, caplog):
    from tests.support.neuron import FAKES

    dev = tmp_path / "dev"
    dev.mkdir()
    assert choose_backend(dev)[0] == "hf"
    monkeypatch.syspath_prepend(str(FAKES))
    assert choose_backend(dev) == ("hf", "no a Neuron device (/dev/neuron*)")
    (dev / "neuron0").touch()
    assert choose_backend(dev)[0] == "neuronx"
    raw = {"continuousBatching": True, "batchSize": 8, "handler": {"model_checkpoint_dir": "m", "backend": "auto"}}
    config = ServingConfig.from_model_yaml(raw)
    with caplog.at_level(logging.INFO):
        assert resolve_auto(config, dev).handler.backend == "neuronx"
    assert "backend auto: using neuronx (transformers-neuronx is installed and 1 Neuron device(s)" in caplog.text


def test_auto_picks_neuronx_for_an_encoder_with_torch_neuronx_and_a_device(tmp_path, monkeypatch, caplog):
    from handler.neuron.auto import choose_encoder_backend
    from tests.support.neuron import FAKES

    dev = tmp_path / "dev"
    dev.mkdir()
    assert choose_encoder_backend(dev)[0] == "hf"
    monkeypatch.syspath_prepend(str(FAKES))
    assert choose_encoder_backend(dev) == ("hf", "no a Neuron device (/dev/neuron*)")
    (dev / "neuron0").touch()
    assert choose_encoder_backend(dev)[0] == "neuronx"
    raw = {
        "batchSize": 8,
        "maxBatchDelay": 5,
        "handler": {"task": "embed", "model_checkpoint_dir": "m", "backend": "auto"},
    }
    config = ServingConfig.from_model_yaml(raw)
    with caplog.at_level(logging.INFO):
        assert resolve_auto(config, dev).handler.backend == "neuronx"
    assert "backend auto: using neuronx (torch-neuronx is installed and 1 Neuron device(s)" in caplog.text


def test_worker_of_reads_torchserve_context():
    context = SimpleNamespace(system_properties={"gpu_id": 3}, model_yaml_config={"minWorkers": 2, "maxWorkers": 4})
    assert worker_of(context) == (3, 4)
    assert worker_of(None) == (None, 1)


def test_extra_flags_of_one_configuration_do_not_leak_into_the_next():
    cache = CacheLocation(Path("/m/artifacts"), "/m/compile-cache")
    env = {"NEURON_CC_FLAGS": "-O2"}
    configure_compiler(["--enable-saturate-infinity"], cache, env)
    configure_compiler([], cache, env)
    assert env["NEURON_CC_FLAGS"] == "-O2 --model-type=transformer"


def test_call_log_checks_fail_on_a_log_nobody_wrote(fake_neuronx, tmp_path):
    """`assert not calls(...)` must not pass because the fake never ran: a missing log fails,
    and importing the fake is enough to create it."""
    from tests.support.neuron import calls

    with pytest.raises(AssertionError, match="never wrote its call log"):
        calls(fake_neuronx, "to_neuron")
    import transformers_neuronx  # noqa: F401

    assert calls(fake_neuronx, "to_neuron") == [] and len(calls(fake_neuronx, "import")) == 1


def test_the_load_or_compile_driver_needs_no_sdk(tmp_path):
    """neuron/load_or_compile.py decides with two callables, so any Neuron backend can use it:
    compile when nothing matches, load what a compile saved, refuse when compiling is off."""
    from handler.errors import ConfigError
    from handler.neuron import artifacts
    from handler.neuron.load_or_compile import Recipe, load_or_compile

    folder, expected, calls = tmp_path / "artifacts", {"sdk": "1.0", "tp_degree": 8}, []

    def compile_and_save():
        calls.append("compile")

        def save_model(path: str) -> None:  # as the SDK's save(dir) does: it makes the folder
            Path(path).mkdir(parents=True)
            (Path(path) / "model.pt").write_text("compiled")

        artifacts.save(folder, expected, save_model)
        return "model"

    def load():
        calls.append("load")
        return ("model", "") if (folder / "model.pt").exists() else (None, "no model.pt")

    recipe = Recipe("nxdi", folder, expected, load, compile_and_save, compile_on_start=True)
    assert load_or_compile(recipe) == ("model", "compile")
    assert load_or_compile(recipe) == ("model", "load")
    assert calls == ["compile", "load"]
    other = Recipe("nxdi", folder, {**expected, "tp_degree": 24}, load, compile_and_save, compile_on_start=False)
    with pytest.raises(ConfigError, match=r"backend nxdi: .* handler\.nxdi\.compile_on_start is false"):
        load_or_compile(other)
