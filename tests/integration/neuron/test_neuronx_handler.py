"""The neuronx backend's start-up with the fake transformers-neuronx, driven directly (no
TorchServe, no engine): continuous batching built from scheduler.n_slots, compile once, load
after, recompile on a mismatch, core placement, warm-up, settings the SDK refuses."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from handler.errors import ConfigError
from tests.support.modes import with_mode
from tests.support.neuron import calls, neuronx_yaml, run_alone

pytestmark = pytest.mark.usefixtures("fake_neuronx")


def artifacts_of(checkpoint: Path) -> Path:
    return checkpoint / "neuron_cache" / "artifacts"


def test_first_start_compiles_and_saves_then_second_start_loads(fake_neuronx, checkpoint, start_backend, caplog):
    caplog.set_level(logging.INFO)
    model_yaml = neuronx_yaml(checkpoint, n_slots=2)
    backend = start_backend(model_yaml)

    [first] = calls(fake_neuronx, "to_neuron")
    assert first["mode"] == "compile" and first["sources"] == {"compiled": first["programs"]}
    assert first["programs"] == 2 + 2  # token buckets [128, 256] at batch 2, context buckets [128, 256] at batch 1
    assert "--model-type=transformer" in first["cc_flags"]
    assert first["cache_url"] == str(checkpoint / "neuron_cache" / "compile-cache")
    assert first["visible_cores"] == "0"
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["batch_size"] == 2 and built["tp_degree"] == 1 and built["amp"] == "f32"
    assert built["n_positions"] == 256 and built["context_length_estimate"] == [128, 256]
    assert built["neuron_config"]["continuous_batching"]["max_num_seqs"] == 2
    assert built["neuron_config"]["lhs_aligned"] is True and built["neuron_config"]["padding_side"] == "right"
    manifest = json.loads((artifacts_of(checkpoint) / "manifest.json").read_text())
    assert manifest["depends_on"]["batch_size"] == 2
    assert manifest["depends_on"]["continuous_batching"] == {"max_num_seqs": 2}
    assert manifest["depends_on"]["neuronx_cc"] == "2.15.128.0+fake"
    assert manifest["files"] and all((artifacts_of(checkpoint) / f).is_file() for f in manifest["files"])
    assert "path=compile" in caplog.text and "continuous batching n_slots=2" in caplog.text
    assert backend.path_taken == "compile" and backend.n_slots == 2 and backend.max_prompt_tokens == 256
    assert len(run_alone(backend, backend.encode("Today the weather is"), 6)) == 6
    backend.close()

    caplog.clear()
    again = start_backend(model_yaml)
    second = calls(fake_neuronx, "to_neuron")[1]
    assert second["mode"] == "load" and second["sources"] == {"loaded": first["programs"]}
    assert [c["directory"] for c in calls(fake_neuronx, "load")] == [str(artifacts_of(checkpoint))]
    assert len(calls(fake_neuronx, "save")) == 1  # nothing compiled, nothing saved again
    assert "path=load" in caplog.text and "no compile" in caplog.text
    assert again.path_taken == "load"


def test_n_slots_is_the_compiled_batch_and_micro_batch_size_is_not(fake_neuronx, checkpoint, start_backend):
    model_yaml = neuronx_yaml(checkpoint, n_slots=3, neuronx={"warmup": False})
    model_yaml["micro_batching"] = {"micro_batch_size": 1}
    backend = start_backend(model_yaml)
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["batch_size"] == 3 and built["neuron_config"]["continuous_batching"]["max_num_seqs"] == 3
    assert backend.n_slots == 3


@pytest.mark.parametrize(
    ("change", "expected_reason"),
    [
        ({"neuronx": {"context_length_estimate": [64, 256]}}, "context_length_estimate: [128, 256] -> [64, 256]"),
        ({"neuronx": {"compiler_flags": ["-O1"]}}, "compiler_flags"),
        ({"env": {"FAKE_NEURONXCC_VERSION": "2.16.0.0+fake"}}, "neuronx_cc: '2.15.128.0+fake' -> '2.16.0.0+fake'"),
        ({"n_slots": 4}, "continuous_batching.max_num_seqs: 2 -> 4"),
    ],
)
def test_manifest_mismatch_recompiles(
    fake_neuronx, checkpoint, start_backend, caplog, monkeypatch, change, expected_reason
):
    from tests.support.neuron import purge_fake_modules

    start_backend(neuronx_yaml(checkpoint), warmup=False).close()
    for key, value in change.pop("env", {}).items():
        monkeypatch.setenv(key, value)
        purge_fake_modules()  # the fake compiler reads its version at import
    caplog.set_level(logging.INFO)
    backend = start_backend(neuronx_yaml(checkpoint, **change))

    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]
    assert "manifest mismatch" in caplog.text and expected_reason in caplog.text
    assert not calls(fake_neuronx, "load")  # checked before load(): no FileNotFoundError path needed
    manifest = json.loads((artifacts_of(checkpoint) / "manifest.json").read_text())
    assert manifest["depends_on"]["continuous_batching"] == {"max_num_seqs": change.get("n_slots", 2)}
    assert manifest["depends_on"]["batch_size"] == change.get("n_slots", 2)
    assert len(run_alone(backend, backend.encode("hello"), 3)) == 3


def test_the_manifest_changes_with_n_slots(fake_neuronx, checkpoint, start_backend):
    """(e) Everything continuous batching compiles in is in the manifest: another n_slots, another manifest."""
    two = start_backend(neuronx_yaml(checkpoint, n_slots=2), warmup=False)
    four = start_backend(neuronx_yaml(checkpoint, n_slots=4, neuronx={"num_cores": 2}), warmup=False)
    assert two.expected["continuous_batching"] == {"max_num_seqs": 2}
    assert four.expected["continuous_batching"] == {"max_num_seqs": 4}
    assert {k: v for k, v in two.expected.items() if k not in ("batch_size", "continuous_batching")} == {
        k: v for k, v in four.expected.items() if k not in ("batch_size", "continuous_batching")
    }


def test_artifacts_that_do_not_load_are_recompiled_not_a_crash(fake_neuronx, checkpoint, start_backend, caplog):
    """A manifest that matches but NEFFs that do not (hand-edited, other release): load() fails
    inside to_neuron() with FileNotFoundError; the backend logs it and compiles."""
    start_backend(neuronx_yaml(checkpoint), warmup=False).close()
    folder = artifacts_of(checkpoint)
    manifest = json.loads((folder / "manifest.json").read_text())
    renamed = []
    for name in manifest["files"]:
        (folder / name).rename(folder / f"x{name}")
        renamed.append(f"x{name}")
    manifest["files"] = renamed
    (folder / "manifest.json").write_text(json.dumps(manifest))
    caplog.set_level(logging.INFO)

    start_backend(neuronx_yaml(checkpoint))
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]
    assert len(calls(fake_neuronx, "load")) == 1
    assert "do not fit" in caplog.text and "Could not find a matching NEFF" in caplog.text
    assert json.loads((folder / "manifest.json").read_text())["files"] == manifest_files(folder)


def manifest_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".neff")


def test_missing_neff_file_means_recompile(fake_neuronx, checkpoint, start_backend, caplog):
    start_backend(neuronx_yaml(checkpoint), warmup=False).close()
    next(artifacts_of(checkpoint).glob("*.neff")).unlink()
    caplog.set_level(logging.INFO)
    start_backend(neuronx_yaml(checkpoint), warmup=False)
    assert "artifacts incomplete" in caplog.text
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]


def test_two_workers_get_disjoint_core_ranges_from_gpu_id(fake_neuronx, checkpoint, start_backend):
    model_yaml = with_mode(
        neuronx_yaml(checkpoint, workers=2, tp_degree=2, neuronx={"num_cores": 4, "warmup": False}), "static", 2
    )
    first = start_backend(model_yaml, gpu_id=0)
    second = start_backend(model_yaml, gpu_id=1)
    assert first.placement.visible_cores == "0-1"
    assert second.placement.visible_cores == "2-3"
    assert [c["visible_cores"] for c in calls(fake_neuronx, "to_neuron")] == ["0-1", "2-3"]
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "load"]


def test_the_operators_visible_cores_are_partitioned_not_replaced(
    fake_neuronx, checkpoint, start_backend, monkeypatch, caplog
):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")  # "run this model on cores 2-3"
    model_yaml = neuronx_yaml(checkpoint, tp_degree=2, neuronx={"num_cores": 24, "warmup": False})
    with caplog.at_level(logging.INFO):
        backend = start_backend(model_yaml, gpu_id=0)
    assert backend.placement.visible_cores == "2-3"
    assert [c["visible_cores"] for c in calls(fake_neuronx, "to_neuron")] == ["2-3"]
    assert "within the operator's NEURON_RT_VISIBLE_CORES=2-3" in caplog.text
    with pytest.raises(ConfigError, match="2 are available"):  # two workers do not fit in two cores
        start_backend(with_mode(neuronx_yaml(checkpoint, workers=2, tp_degree=2), "static", 2), gpu_id=1)


def test_without_gpu_id_workers_claim_free_slots(fake_neuronx, checkpoint, start_backend):
    model_yaml = with_mode(
        neuronx_yaml(checkpoint, workers=2, tp_degree=2, neuronx={"num_cores": 4, "warmup": False}), "static", 2
    )
    first = start_backend(model_yaml)
    second = start_backend(model_yaml)
    assert [first.placement.first, second.placement.first] == [0, 2]
    with pytest.raises(ConfigError, match="held by other processes"):
        start_backend(model_yaml)
    second.close()  # a worker that goes away frees its cores for the next one
    third = start_backend(model_yaml)
    assert third.placement.visible_cores == "2-3"


def test_more_workers_than_cores_is_refused_with_what_fits(fake_neuronx, checkpoint, start_backend):
    model_yaml = with_mode(neuronx_yaml(checkpoint, workers=3, tp_degree=2, neuronx={"num_cores": 4}), "static", 2)
    with pytest.raises(ConfigError) as info:
        start_backend(model_yaml, gpu_id=0)
    message = str(info.value)
    assert "3 worker(s) x tp_degree 2 need 6 NeuronCores but 4 are available" in message
    assert "at most 2 worker(s) at tp_degree 2" in message and "tp_degree <= 1 for 3 workers" in message
    assert "transformers_neuronx" not in sys.modules  # refused before the SDK was even imported


def test_gpu_id_beyond_the_cores_is_refused(fake_neuronx, checkpoint, start_backend):
    with pytest.raises(ConfigError, match=r"set number_of_gpu in config\.properties to 2 or fewer"):
        start_backend(neuronx_yaml(checkpoint, workers=1, neuronx={"num_cores": 2}), gpu_id=2)


def test_warmup_runs_every_context_bucket_and_the_decode_kernel_over_all_slots(
    fake_neuronx, checkpoint, start_backend, caplog
):
    caplog.set_level(logging.INFO)
    backend = start_backend(neuronx_yaml(checkpoint, n_slots=3, neuronx={"context_length_estimate": [16, 64, 256]}))
    forwards = calls(fake_neuronx, "forward")
    contexts = [c for c in forwards if c["kind"] == "context"]
    # the other slots' 1-token prompts (as 2-token rows), then one prompt per bucket into slot 0
    assert [(c["start_ids"], c["length"], c["bucket"]) for c in contexts] == [
        ([1], 2, 16),
        ([2], 2, 16),
        ([0], 16, 16),
        ([0], 64, 64),
        ([0], 255, 256),  # n_positions - 1: room for the decode step
    ]
    decodes = [c for c in forwards if c["kind"] == "decode"]
    assert len(decodes) == 3 and all(c["rows"] == 3 and not c["padded_lines"] for c in decodes)
    assert [c["bucket"] for c in decodes] == [128, 128, 256]  # the token buckets the decode positions fall in
    assert "warm-up of 3 context bucket(s) [16, 64, 256] with a decode step over 3 slot(s)" in caplog.text
    assert backend.decode([]) == []  # every slot released afterwards
    backend.prefill([])  # and every slot free


def test_warmup_failure_fails_the_start(fake_neuronx, checkpoint, start_backend, monkeypatch):
    from transformers_neuronx import base

    def broken(self, *args, **kwargs):
        raise RuntimeError("nrt_execute status=1006")

    monkeypatch.setattr(base.NeuronModelBase, "forward", broken)
    with pytest.raises(RuntimeError, match=r"warm-up failed for context bucket 128 .*nrt_execute status=1006"):
        start_backend(neuronx_yaml(checkpoint, n_slots=1))
    with pytest.raises(RuntimeError, match=r"warm-up failed for the other slots' 1-token prompts.*status=1006"):
        start_backend(neuronx_yaml(checkpoint, n_slots=2, neuronx={"num_cores": 2}))


def test_neuron_config_options_reach_transformers_neuronx(fake_neuronx, checkpoint, start_backend):
    options = {
        "group_query_attention": "shard-over-heads",
        "quantize_weights": "s8",
        "neuron_config": {"fuse_qkv": True},
        "warmup": False,
    }
    start_backend(neuronx_yaml(checkpoint, amp="bf16", neuronx=options))
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["neuron_config"]["group_query_attention"] == "shard-over-heads"
    assert built["neuron_config"]["fuse_qkv"] is True
    assert built["neuron_config"]["quant"]["quant_dtype"] == "s8"
    assert built["neuron_config"]["quant"]["dequant_dtype"] == "bf16"
    assert built["neuron_config"]["continuous_batching"]["max_num_seqs"] == 2
    assert built["amp"] == "bf16"


@pytest.mark.parametrize(
    ("neuronx", "message"),
    [
        ({"neuron_config": {"fuse_qkvv": True}}, "Unexpected NeuronConfig keyword arguments"),
        ({"context_length_estimate": [128, 512]}, "bucket 512 is above n_positions (256)"),
        ({"model_class": "gemma.model.GemmaForSampling"}, "transformers_neuronx has no 'gemma.model.GemmaForSampling'"),
    ],
)
def test_bad_neuronx_settings_fail_the_start_naming_the_key(fake_neuronx, checkpoint, start_backend, neuronx, message):
    model_yaml = neuronx_yaml(checkpoint, neuronx={"num_cores": 1, **neuronx})
    with pytest.raises(ConfigError, match=r"handler\.neuronx") as info:
        start_backend(model_yaml)
    assert message in str(info.value)
    start_backend(neuronx_yaml(checkpoint, neuronx={"num_cores": 1}))  # the failed start gave its only core back


def test_mistral_class_is_configurable(fake_neuronx, checkpoint, start_backend):
    start_backend(neuronx_yaml(checkpoint, neuronx={"model_class": "mistral.model.MistralForSampling"}))
    assert calls(fake_neuronx, "from_pretrained")[0]["cls"] == "MistralForSampling"


def test_shared_cache_dir_and_operator_dump_dir(fake_neuronx, checkpoint, start_backend, tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared-cache"
    monkeypatch.setenv("NEURONX_DUMP_TO", str(tmp_path / "dump"))
    caplog.set_level(logging.INFO)
    start_backend(neuronx_yaml(checkpoint, neuronx={"cache_dir": str(shared), "warmup": False}))
    [compiled] = calls(fake_neuronx, "to_neuron")
    assert compiled["dump_to"] == str(tmp_path / "dump")
    assert (shared / "artifacts" / "manifest.json").is_file()
    assert "compile cache: NEURONX_DUMP_TO=" in caplog.text


def test_a_closed_backend_refuses_to_run(fake_neuronx, checkpoint, start_backend):
    from tests.support.neuron import greedy

    backend = start_backend(neuronx_yaml(checkpoint, neuronx={"warmup": False}))
    backend.close()
    assert backend.placement is None
    with pytest.raises(RuntimeError, match="closed"):
        backend.prefill([greedy(0, [5, 6])])
