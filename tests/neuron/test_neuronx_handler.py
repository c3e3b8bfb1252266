"""The neuronx backend through the real handler (TorchServe harness, no Java) with the fake
transformers-neuronx: compile once, load after, recompile on a mismatch, core placement,
warm-up, request limits."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from handler.config import ConfigError
from tests.neuron.conftest import calls, neuronx_yaml
from tests.torchserve_harness import run_batch

pytestmark = pytest.mark.usefixtures("fake_neuronx")


def artifacts_of(checkpoint: Path) -> Path:
    return checkpoint / "neuron_cache" / "artifacts"


def test_first_start_compiles_and_saves_then_second_start_loads(fake_neuronx, checkpoint, start_handler, caplog):
    caplog.set_level(logging.INFO)
    model_yaml = neuronx_yaml(checkpoint, micro_batch_size=2)
    handler, context = start_handler(model_yaml)

    [first] = calls(fake_neuronx, "to_neuron")
    assert first["mode"] == "compile" and first["sources"] == {"compiled": first["programs"]}
    assert "--model-type=transformer" in first["cc_flags"]
    assert first["cache_url"] == str(checkpoint / "neuron_cache" / "compile-cache")
    assert first["visible_cores"] == "0"
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["batch_size"] == 2 and built["tp_degree"] == 1 and built["amp"] == "f32"
    assert built["n_positions"] == 256 and built["context_length_estimate"] == [128, 256]
    manifest = json.loads((artifacts_of(checkpoint) / "manifest.json").read_text())
    assert manifest["depends_on"]["batch_size"] == 2
    assert manifest["depends_on"]["neuronx_cc"] == "2.15.128.0+fake"
    assert manifest["files"] and all((artifacts_of(checkpoint) / f).is_file() for f in manifest["files"])
    assert "path=compile" in caplog.text

    [reply] = run_batch(handler, context, [{"prompt": "Today the weather is", "max_new_tokens": 6, "stream": True}])
    assert reply.status == 200 and reply.lines[-1]["finish_reason"] in ("length", "eos")
    handler.shutdown()

    caplog.clear()
    start_handler(model_yaml)
    second = calls(fake_neuronx, "to_neuron")[1]
    assert second["mode"] == "load" and second["sources"] == {"loaded": first["programs"]}
    assert [c["directory"] for c in calls(fake_neuronx, "load")] == [str(artifacts_of(checkpoint))]
    assert len(calls(fake_neuronx, "save")) == 1  # nothing compiled, nothing saved again
    assert "path=load" in caplog.text and "no compile" in caplog.text


@pytest.mark.parametrize(
    ("change", "expected_reason"),
    [
        ({"neuronx": {"context_length_estimate": [64, 256]}}, "context_length_estimate: [128, 256] -> [64, 256]"),
        ({"neuronx": {"compiler_flags": ["-O1"]}}, "compiler_flags"),
        ({"env": {"FAKE_NEURONXCC_VERSION": "2.16.0.0+fake"}}, "neuronx_cc: '2.15.128.0+fake' -> '2.16.0.0+fake'"),
        ({"micro_batch_size": 4}, "batch_size: 2 -> 4"),
    ],
)
def test_manifest_mismatch_recompiles(
    fake_neuronx, checkpoint, start_handler, caplog, monkeypatch, change, expected_reason
):
    from tests.neuron.conftest import purge_fake_modules

    handler, _ = start_handler(neuronx_yaml(checkpoint))
    handler.shutdown()
    for key, value in change.pop("env", {}).items():
        monkeypatch.setenv(key, value)
        purge_fake_modules()  # the fake compiler reads its version at import
    caplog.set_level(logging.INFO)
    handler, context = start_handler(neuronx_yaml(checkpoint, **change))

    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]
    assert "manifest mismatch" in caplog.text and expected_reason in caplog.text
    assert not calls(fake_neuronx, "load")  # checked before load(): no FileNotFoundError path needed
    manifest = json.loads((artifacts_of(checkpoint) / "manifest.json").read_text())
    assert manifest["depends_on"]["batch_size"] == change.get("micro_batch_size", 2)
    [reply] = run_batch(handler, context, [{"prompt": "hello", "max_new_tokens": 3, "stream": False}])
    assert reply.status == 200


def test_artifacts_that_do_not_load_are_recompiled_not_a_crash(fake_neuronx, checkpoint, start_handler, caplog):
    """A manifest that matches but NEFFs that do not (hand-edited, other release): load() fails
    inside to_neuron() with FileNotFoundError; the backend logs it and compiles."""
    handler, _ = start_handler(neuronx_yaml(checkpoint))
    handler.shutdown()
    folder = artifacts_of(checkpoint)
    manifest = json.loads((folder / "manifest.json").read_text())
    renamed = []
    for name in manifest["files"]:
        (folder / name).rename(folder / f"x{name}")
        renamed.append(f"x{name}")
    manifest["files"] = renamed
    (folder / "manifest.json").write_text(json.dumps(manifest))
    caplog.set_level(logging.INFO)

    start_handler(neuronx_yaml(checkpoint))
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]
    assert len(calls(fake_neuronx, "load")) == 1
    assert "do not fit" in caplog.text and "Could not find a matching NEFF" in caplog.text
    assert json.loads((folder / "manifest.json").read_text())["files"] == manifest_files(folder)


def manifest_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.suffix == ".neff")


def test_missing_neff_file_means_recompile(fake_neuronx, checkpoint, start_handler, caplog):
    handler, _ = start_handler(neuronx_yaml(checkpoint))
    handler.shutdown()
    next(artifacts_of(checkpoint).glob("*.neff")).unlink()
    caplog.set_level(logging.INFO)
    start_handler(neuronx_yaml(checkpoint))
    assert "artifacts incomplete" in caplog.text
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "compile"]


def test_compile_on_start_false_refuses_without_artifacts(fake_neuronx, checkpoint, start_handler):
    with pytest.raises(ConfigError, match="make compile"):
        start_handler(neuronx_yaml(checkpoint, neuronx={"compile_on_start": False}))
    assert not calls(fake_neuronx, "to_neuron")


def test_two_workers_get_disjoint_core_ranges_from_gpu_id(fake_neuronx, checkpoint, start_handler):
    model_yaml = neuronx_yaml(checkpoint, workers=2, tp_degree=2, neuronx={"num_cores": 4})
    first, _ = start_handler(model_yaml, gpu_id=0)
    second, _ = start_handler(model_yaml, gpu_id=1)
    assert first.service.backend.placement.visible_cores == "0-1"
    assert second.service.backend.placement.visible_cores == "2-3"
    assert [c["visible_cores"] for c in calls(fake_neuronx, "to_neuron")] == ["0-1", "2-3"]
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "load"]


def test_without_gpu_id_workers_claim_free_slots(fake_neuronx, checkpoint, start_handler):
    model_yaml = neuronx_yaml(checkpoint, workers=2, tp_degree=2, neuronx={"num_cores": 4})
    first, _ = start_handler(model_yaml)
    second, _ = start_handler(model_yaml)
    assert [first.service.backend.placement.first, second.service.backend.placement.first] == [0, 2]
    with pytest.raises(ConfigError, match="held by other processes"):
        start_handler(model_yaml)
    second.shutdown()  # a worker that goes away frees its cores for the next one
    third, _ = start_handler(model_yaml)
    assert third.service.backend.placement.visible_cores == "2-3"


def test_more_workers_than_cores_is_refused_with_what_fits(fake_neuronx, checkpoint, start_handler):
    model_yaml = neuronx_yaml(checkpoint, workers=3, tp_degree=2, neuronx={"num_cores": 4})
    with pytest.raises(ConfigError) as info:
        start_handler(model_yaml, gpu_id=0)
    message = str(info.value)
    assert "3 worker(s) x tp_degree 2 need 6 NeuronCores but 4 are available" in message
    assert "at most 2 worker(s) at tp_degree 2" in message and "tp_degree <= 1 for 3 workers" in message
    assert "transformers_neuronx" not in sys.modules  # refused before the SDK was even imported


def test_gpu_id_beyond_the_cores_is_refused(fake_neuronx, checkpoint, start_handler):
    with pytest.raises(ConfigError, match=r"set number_of_gpu in config\.properties to 2 or fewer"):
        start_handler(neuronx_yaml(checkpoint, workers=1, neuronx={"num_cores": 2}), gpu_id=2)


def test_warmup_runs_every_context_bucket_with_the_compiled_batch(fake_neuronx, checkpoint, start_handler):
    start_handler(neuronx_yaml(checkpoint, micro_batch_size=2, neuronx={"context_length_estimate": [16, 64, 256]}))
    contexts = calls(fake_neuronx, "context")
    assert [c["bucket"] for c in contexts] == [16, 64, 256]
    assert {c["batch_size"] for c in contexts} == {2}


def test_warmup_failure_fails_initialize(fake_neuronx, checkpoint, start_handler, monkeypatch):
    from transformers_neuronx import base

    def broken(self, *args, **kwargs):
        raise RuntimeError("nrt_execute status=1006")

    monkeypatch.setattr(base.NeuronModelBase, "forward", broken)
    with pytest.raises(RuntimeError, match=r"warm-up failed for context bucket 128 .*nrt_execute status=1006"):
        start_handler(neuronx_yaml(checkpoint))


def test_prompt_longer_than_n_positions_gets_400_and_batch_mates_are_served(fake_neuronx, checkpoint, start_handler):
    handler, context = start_handler(neuronx_yaml(checkpoint))
    long_prompt = "the weather is nice " * 200
    long, short = run_batch(
        handler,
        context,
        [{"prompt": long_prompt, "max_new_tokens": 4}, {"prompt": "Today", "max_new_tokens": 4, "stream": False}],
    )
    assert long.status == 400 and "n_positions (256)" in long.final
    assert short.status == 200


def test_batch_of_one_is_padded_to_the_compiled_batch(fake_neuronx, checkpoint, start_handler):
    """The compiled batch is static: a lone request runs with dummy rows (else KeyError in the model)."""
    handler, context = start_handler(neuronx_yaml(checkpoint, micro_batch_size=4))
    rows = [{"prompt": "Today the weather", "max_new_tokens": 5, "stream": False}]
    [alone] = run_batch(handler, context, rows)
    together = run_batch(handler, context, rows * 3)
    assert alone.status == 200 and all(r.status == 200 for r in together)
    assert {r.final for r in together} == {alone.final}  # greedy: same text whoever the batch-mates are


def test_neuronx_matches_the_hf_backend_greedy(fake_neuronx, checkpoint, start_handler):
    """The adapter path (start_ids from the attention mask, cache_ids) gives the hf backend's tokens."""
    rows = [{"prompt": "Today the weather is", "max_new_tokens": 8, "stream": False}]
    neuron_handler, neuron_context = start_handler(neuronx_yaml(checkpoint))
    hf_yaml = neuronx_yaml(checkpoint)
    hf_yaml["handler"]["backend"] = "hf"
    hf_handler, hf_context = start_handler(hf_yaml)
    [neuron] = run_batch(neuron_handler, neuron_context, rows)
    [hf] = run_batch(hf_handler, hf_context, rows)
    assert json.loads(neuron.final)["text"] == json.loads(hf.final)["text"]


def test_neuron_config_options_reach_transformers_neuronx(fake_neuronx, checkpoint, start_handler):
    options = {
        "group_query_attention": "shard-over-heads",
        "quantize_weights": "s8",
        "neuron_config": {"fuse_qkv": True},
    }
    start_handler(neuronx_yaml(checkpoint, amp="bf16", neuronx=options))
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["neuron_config"]["group_query_attention"] == "shard-over-heads"
    assert built["neuron_config"]["fuse_qkv"] is True
    assert built["neuron_config"]["quant"]["quant_dtype"] == "s8"
    assert built["neuron_config"]["quant"]["dequant_dtype"] == "bf16"
    assert built["amp"] == "bf16"


@pytest.mark.parametrize(
    ("neuronx", "message"),
    [
        ({"neuron_config": {"fuse_qkvv": True}}, "Unexpected NeuronConfig keyword arguments"),
        ({"context_length_estimate": [128, 512]}, "bucket 512 is above n_positions (256)"),
        ({"model_class": "gemma.model.GemmaForSampling"}, "transformers_neuronx has no 'gemma.model.GemmaForSampling'"),
    ],
)
def test_bad_neuronx_settings_fail_initialize_naming_the_key(fake_neuronx, checkpoint, start_handler, neuronx, message):
    model_yaml = neuronx_yaml(checkpoint, neuronx={"num_cores": 1, **neuronx})
    with pytest.raises(ConfigError, match=r"handler\.neuronx") as info:
        start_handler(model_yaml)
    assert message in str(info.value)
    start_handler(neuronx_yaml(checkpoint, neuronx={"num_cores": 1}))  # the failed start gave its only core back


def test_mistral_class_is_configurable(fake_neuronx, checkpoint, start_handler):
    start_handler(neuronx_yaml(checkpoint, neuronx={"model_class": "mistral.model.MistralForSampling"}))
    assert calls(fake_neuronx, "from_pretrained")[0]["cls"] == "MistralForSampling"


def test_shared_cache_dir_and_operator_dump_dir(fake_neuronx, checkpoint, start_handler, tmp_path, monkeypatch, caplog):
    shared = tmp_path / "shared-cache"
    monkeypatch.setenv("NEURONX_DUMP_TO", str(tmp_path / "dump"))
    caplog.set_level(logging.INFO)
    start_handler(neuronx_yaml(checkpoint, neuronx={"cache_dir": str(shared)}))
    [compiled] = calls(fake_neuronx, "to_neuron")
    assert compiled["dump_to"] == str(tmp_path / "dump")
    assert (shared / "artifacts" / "manifest.json").is_file()
    assert "compile cache: NEURONX_DUMP_TO=" in caplog.text


def test_parallel_inference_threads_take_turns_on_the_one_compiled_model(fake_neuronx, checkpoint, start_handler):
    """Two micro-batches at once (parallelism.inference=2) must not share the model's step state."""
    model_yaml = neuronx_yaml(checkpoint, micro_batch_size=1)
    model_yaml["micro_batching"]["parallelism"] = {"inference": 2}
    handler, context = start_handler(model_yaml)
    prompts = ["Today the weather is", "Once upon a time there"]
    alone = [run_batch(handler, context, [{"prompt": p, "max_new_tokens": 12, "stream": False}])[0] for p in prompts]
    together = run_batch(handler, context, [{"prompt": p, "max_new_tokens": 12, "stream": False} for p in prompts])
    assert [r.status for r in together] == [200, 200]
    assert [json.loads(r.final)["text"] for r in together] == [json.loads(r.final)["text"] for r in alone]
