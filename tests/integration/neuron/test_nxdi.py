"""The nxdi backend (NxD Inference) on the fake NxDI (tests/fakes/neuronx_distributed_inference):
the invariants the neuronx backend proves, for the SDK 2.26-2.31 stack.

The fake models NxDI's traps (shared/pitfalls.md): a decode that leaves out a live slot runs
it as a copy of the first row and overwrites its KV; a full batch ignores seq_ids; a
context-encoding call takes one prompt; logits come with the vocabulary padded for tp_degree;
on-device sampling honours per-row values only with dynamic=True. So a greedy request's tokens
here must equal the Hugging Face model's, whoever its batch-mates are and whenever it came; the
tests both backends share run over both fakes in test_device_backends.py."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends.nxdi import compile_work_dir
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.request import GenerationRequest, SamplingParams, SlotRequest, SlotRequestError
from tests.support.engine_runs import run_to_end
from tests.support.neuron import Driver, calls, greedy, hf_greedy, nxdi_yaml, run_alone


def test_a_one_token_prompt_runs_in_the_smallest_bucket_and_is_the_models_own(backend, checkpoint, fake_neuronx):
    one = backend.encode("Today")[:1]
    alone_other = run_alone(backend, backend.encode(PROMPTS[0]), 7, slot=2)
    others = Driver(backend)
    others.join(greedy(0, backend.encode(PROMPTS[0])))
    others.step()
    others.join(greedy(1, one))
    for _ in range(5):
        others.step()
    assert others.leave(1)[:6] == hf_greedy(checkpoint, one, 6)
    assert others.leave(0)[:7] == alone_other
    [context] = [f for f in forwards(fake_neuronx) if f["kind"] == "context" and f["positions"] == [[0, 0]]]
    assert context["programs"][0]["bucket"] == 16


pytestmark = pytest.mark.usefixtures("fake_neuronx", "one_torch_thread")


PROMPTS = ["Today the weather is", "Once upon a time there was", "The capital of France"]


@pytest.fixture
def backend(checkpoint, start_backend):
    return start_backend(nxdi_yaml(checkpoint, n_slots=3, nxdi={"context_buckets": [16, 256]}))


def artifacts_of(checkpoint: Path) -> Path:
    return checkpoint / "neuron_cache" / "artifacts"


def forwards(call_log: Path) -> list[dict[str, Any]]:
    return calls(call_log, "forward")


@pytest.mark.compile_in_child
def test_compiles_once_in_a_child_then_loads(fake_neuronx, checkpoint, start_backend, caplog):
    caplog.set_level(logging.INFO)
    model_yaml = nxdi_yaml(checkpoint, n_slots=2)
    backend = start_backend(model_yaml)
    [compiled] = calls(fake_neuronx, "compile")
    assert compiled["pid"] != calls(fake_neuronx, "load")[0]["pid"], "the compile ran in the worker's process"
    assert compiled["workdir"] == f"{compile_work_dir(artifacts_of(checkpoint))}/", "not the folder's own scratch"
    assert not compile_work_dir(artifacts_of(checkpoint)).exists()  # removed after the compile
    assert compiled["batch_sizes"] == {"context_encoding_model": 1, "token_generation_model": 2}
    assert compiled["sharded"] is True
    manifest = json.loads((artifacts_of(checkpoint) / "manifest.json").read_text())
    depends = manifest["depends_on"]
    assert (
        depends["neuron_config"]["is_continuous_batching"] is True and depends["neuron_config"]["ctx_batch_size"] == 1
    )
    assert depends["neuronx_distributed_inference"].startswith("0.8")
    weights = checkpoint / "model.safetensors"
    assert depends["checkpoint"]["weights"] == {
        "model.safetensors": {
            "size": weights.stat().st_size,
            "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        }
    }
    assert any(f.startswith("weights/") for f in manifest["files"]) and "model.pt" in manifest["files"]
    assert backend.path_taken == "compile" and "path=compile" in caplog.text
    backend.close()

    again = start_backend(model_yaml)
    assert again.path_taken == "load" and len(calls(fake_neuronx, "compile")) == 1
    assert calls(fake_neuronx, "load")[-1]["weights"] == "presharded"


def test_a_stale_manifest_recompiles_with_the_reason(fake_neuronx, checkpoint, start_backend, caplog):
    start_backend(nxdi_yaml(checkpoint, n_slots=2)).close()
    caplog.set_level(logging.INFO)
    changed = start_backend(nxdi_yaml(checkpoint, n_slots=2, nxdi={"token_buckets": [64, 256]}))
    assert changed.path_taken == "compile" and len(calls(fake_neuronx, "compile")) == 2
    assert "manifest mismatch (neuron_config.token_generation_buckets: [128, 256] -> [64, 256]" in caplog.text


def test_logits_wider_than_the_vocabulary_are_cut_before_sampling(backend):
    """Logits with columns beyond the vocabulary (NxDI pads for tp_degree when on-device sampling
    also returns logits) never reach the sampler: a padded column holding the largest value loses."""
    logits = torch.zeros((2, 1, backend.vocab_size + 8))
    logits[:, 0, 7] = 1.0
    logits[:, 0, backend.vocab_size + 3] = 100.0  # padding
    rows = backend._last_logits(logits)
    assert rows.shape == (2, backend.vocab_size) and rows.argmax(dim=-1).tolist() == [7, 7]


def engine_run(backend: Any, requests: list[GenerationRequest]) -> list[list[int]]:
    """Every request through a StepEngine (more requests than slots wait for one); their tokens."""
    return [s.token_ids for s in run_to_end(backend, requests)]


def test_more_requests_than_slots_and_seeded_sampling_whatever_the_batch(backend):
    seeded = [
        GenerationRequest(
            p, 10, SamplingParams(do_sample=True, temperature=0.9, top_p=0.9, seed=7 + i), ignore_eos=True
        )
        for i, p in enumerate(PROMPTS * 2)
    ]
    together = engine_run(backend, seeded)  # 6 requests, 3 slots
    alone = [engine_run(backend, [request])[0] for request in seeded[:3]]
    assert together[:3] == alone
    greedy_requests = [GenerationRequest(p, 8, ignore_eos=True) for p in PROMPTS]
    assert engine_run(backend, greedy_requests) == [engine_run(backend, [r])[0] for r in greedy_requests]


def test_unknown_and_refused_neuron_config_keys(checkpoint, start_backend):
    with pytest.raises(ConfigError, match=r"handler.nxdi.neuron_config: .*no NeuronConfig keyword 'fused_qvk'"):
        start_backend(nxdi_yaml(checkpoint, nxdi={"neuron_config": {"fused_qvk": True}}))
    with pytest.raises(ConfigError, match=r"handler.nxdi.neuron_config.ctx_batch_size: refused"):
        ServingConfig.from_model_yaml(nxdi_yaml(checkpoint, nxdi={"neuron_config": {"ctx_batch_size": 2}}))


@pytest.mark.parametrize(
    "model_class",
    ["qwen2.modeling_qwen2.NeuronQwen2ForCausalLM", "qwen3.modeling_qwen3.NeuronQwen3ForCausalLM"],
)
def test_other_families_resolve_and_a_missing_class_is_named(checkpoint, model_class):
    from handler.backends.nxdi import Sdk

    assert Sdk.load(model_class).model_cls.__name__ == model_class.rsplit(".", 1)[1]
    with pytest.raises(ConfigError, match=r"handler.nxdi.model_class: .*has no 'llama.modeling_llama.NoSuch'"):
        Sdk.load("llama.modeling_llama.NoSuch")


# -- on-device sampling ----------------------------------------------------------------------------------
@pytest.fixture
def on_device(checkpoint, start_backend):
    return start_backend(nxdi_yaml(checkpoint, n_slots=2, nxdi={"on_device_sampling": True, "global_topk": 64}))


def test_on_device_greedy_is_the_models_own_and_rows_carry_their_own_params(on_device, checkpoint, fake_neuronx):
    prompt = on_device.encode(PROMPTS[0])
    assert run_alone(on_device, prompt, 6) == hf_greedy(checkpoint, prompt, 6)
    driver = Driver(on_device)
    driver.join(
        SlotRequest(1, tuple(prompt), SamplingParams(do_sample=True, top_k=40, top_p=0.8, temperature=0.7)),
        greedy(0, prompt),
    )
    driver.step()
    decode = [f for f in forwards(fake_neuronx) if f["kind"] != "context"][-1]
    assert decode["sampling_params"] == [[1.0, 1.0, 1.0], [40.0, pytest.approx(0.8), pytest.approx(0.7)]]


@pytest.mark.parametrize(
    ("sampling", "field"),
    [
        (SamplingParams(do_sample=True, seed=3), "seed"),
        (SamplingParams(repetition_penalty=1.2), "repetition_penalty"),
        (SamplingParams(do_sample=True, top_k=100), "top_k"),
    ],
)
def test_on_device_refuses_what_the_device_cannot_do(on_device, sampling, field):
    refusal = on_device.request_refusal(GenerationRequest("hi", 4, sampling))
    assert refusal is not None and refusal[0] == field
    assert on_device.logprobs_refusal(True, False) is not None
    assert (
        on_device.request_refusal(
            GenerationRequest("hi", 4, SamplingParams(do_sample=True, seed=3, seed_from_client=False))
        )
        is None
    )


def test_host_sampling_refuses_nothing_but_prompt_logprobs(backend):
    assert (
        backend.request_refusal(
            GenerationRequest("hi", 4, SamplingParams(do_sample=True, seed=3, repetition_penalty=1.3, top_k=1000))
        )
        is None
    )
    assert backend.logprobs_refusal(True, False) is None
    assert "last position" in backend.logprobs_refusal(False, True)


# -- replicas ----------------------------------------------------------------------------------------
def test_on_device_refusals_are_400s_naming_the_field_through_the_handler(checkpoint, start_handler):
    import json as jsonlib

    from tests.support.torchserve_harness import ContinuousFrontend

    yaml = nxdi_yaml(checkpoint, n_slots=2, nxdi={"on_device_sampling": True})
    handler, context = start_handler(yaml)
    bodies = [
        {"prompt": "Hi", "max_new_tokens": 4, "do_sample": True, "seed": 5, "stream": False},
        {"prompt": "Hi", "max_new_tokens": 4, "repetition_penalty": 1.3, "stream": False},
        {"prompt": "Hi", "max_new_tokens": 4, "do_sample": True, "top_k": 40, "stream": False},
    ]
    seeded, penalised, fine = ContinuousFrontend(handler, context, batch_size=6).serve(bodies)
    for reply, field in ((seeded, "seed"), (penalised, "repetition_penalty")):
        body = jsonlib.loads(reply.body)
        assert reply.status == 400 and body["error"]["param"] == field, body
        assert "handler.nxdi.on_device_sampling" in body["error"]["message"]
    assert fine.status == 200 and jsonlib.loads(fine.body)["finish_reason"] == "length"


@pytest.fixture
def tiny_qwen2(checkpoint: Path) -> Path:
    """A Qwen2 checkpoint of random weights with the tiny model's tokenizer (the fake serves each
    NxDI class only for its own model_type)."""
    import shutil

    import torch
    from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

    llama = AutoConfig.from_pretrained(checkpoint)
    target = checkpoint.with_name("qwen2")
    target.mkdir()
    for tokenizer_file in checkpoint.glob("*token*"):
        shutil.copy(tokenizer_file, target / tokenizer_file.name)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=llama.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=llama.bos_token_id,
        eos_token_id=llama.eos_token_id,
        tie_word_embeddings=False,
    )
    Qwen2ForCausalLM(config).save_pretrained(target, safe_serialization=True)
    return target


def test_a_qwen2_checkpoint_through_its_class_is_the_models_own(tiny_qwen2, start_backend):
    yaml = nxdi_yaml(tiny_qwen2, n_slots=2, nxdi={"model_class": "qwen2.modeling_qwen2.NeuronQwen2ForCausalLM"})
    backend = start_backend(yaml)
    prompt = backend.encode(PROMPTS[1])
    assert run_alone(backend, prompt, 8) == hf_greedy(tiny_qwen2, prompt, 8)
    with pytest.raises(Exception, match=r"cannot serve a 'qwen2' checkpoint"):  # the fake's stand-in for garbage
        start_backend(nxdi_yaml(tiny_qwen2, n_slots=2))


# -- issue 30: artifacts tied to the checkpoint's content, a compile cache that hits, reachable positions --
def reexport_with_new_values(checkpoint: Path) -> None:
    """A fine-tune written over the checkpoint: the same tensors' shapes, so the same file size."""
    from safetensors.torch import load_file, save_file

    path = checkpoint / "model.safetensors"
    size = path.stat().st_size
    tensors = {name: tensor * 0.5 + 0.01 for name, tensor in load_file(path).items()}
    save_file(tensors, path, metadata={"format": "pt"})
    assert path.stat().st_size == size  # what sizes alone could not tell apart


def test_new_weights_of_the_same_size_are_resharded_and_served(fake_neuronx, checkpoint, start_backend, caplog):
    model_yaml = nxdi_yaml(checkpoint, n_slots=2)
    start_backend(model_yaml).close()
    reexport_with_new_values(checkpoint)
    caplog.set_level(logging.INFO)
    again = start_backend(model_yaml)
    assert again.path_taken == "compile", "the old pre-sharded weights were loaded"
    assert "checkpoint.weights.model.safetensors.sha256" in caplog.text  # the reason names the file
    prompt = again.encode(PROMPTS[0])
    assert run_alone(again, prompt, 6) == hf_greedy(checkpoint, prompt, 6)  # the new weights answer


def test_new_weights_with_compiling_off_refuse_to_start_naming_the_file(fake_neuronx, checkpoint, start_backend):
    start_backend(nxdi_yaml(checkpoint, n_slots=2)).close()
    reexport_with_new_values(checkpoint)
    with pytest.raises(ConfigError, match=r"checkpoint\.weights\.model\.safetensors\.sha256"):
        start_backend(nxdi_yaml(checkpoint, n_slots=2, nxdi={"compile_on_start": False}))


def test_an_unchanged_checkpoint_is_hashed_once_and_then_only_stat(fake_neuronx, checkpoint, start_backend, caplog):
    model_yaml = nxdi_yaml(checkpoint, n_slots=2)
    caplog.set_level(logging.INFO, logger="handler.neuron.checkpoint_identity")
    start_backend(model_yaml).close()
    assert "hashed 1 weight file(s)" in caplog.text
    caplog.clear()
    (checkpoint / "model.safetensors").touch()  # a copy that kept the content: one hash, no recompile
    assert start_backend(model_yaml).path_taken == "load" and "hashed 1 weight file(s)" in caplog.text
    caplog.clear()
    assert start_backend(model_yaml).path_taken == "load" and "hashed" not in caplog.text


def test_a_second_compile_of_the_same_configuration_takes_every_graph_from_the_cache(
    fake_neuronx, checkpoint, start_backend
):
    model_yaml = nxdi_yaml(checkpoint, n_slots=2)
    start_backend(model_yaml).close()
    first = calls(fake_neuronx, "neff")
    assert first and all(n["cache"] == "miss" for n in first)
    shutil.rmtree(artifacts_of(checkpoint))  # a cleaned artifacts folder (or a second host, a CI job)
    assert start_backend(model_yaml).path_taken == "compile"
    second = calls(fake_neuronx, "neff")[len(first) :]
    assert len(second) == len(first) and all(n["cache"] == "hit" for n in second)


@pytest.mark.parametrize(
    ("nxdi", "key"),
    [
        ({"token_buckets": [64, 128]}, "token_buckets: the largest token bucket \\(128\\) is below n_positions"),
        ({"context_buckets": [16, 256], "token_buckets": [64, 128]}, "token_buckets"),
    ],
)
def test_a_bucket_layout_that_leaves_positions_unservable_is_refused_at_start(checkpoint, start_backend, nxdi, key):
    with pytest.raises(ConfigError, match=key):
        start_backend(nxdi_yaml(checkpoint, nxdi=nxdi))


def test_a_row_past_the_compiled_positions_fails_alone_and_its_batch_mate_goes_on(backend):
    """Forced: the backend is told its largest token bucket is 24 after start (the receipt and start
    checks keep real requests within the buckets). The long row fails with a 400 naming
    max_new_tokens; the other, shorter one is served to its end, before and after."""
    from handler.engine.sequence import Sequence
    from handler.engine.step_engine import StepEngine

    backend.token_buckets = [*backend.token_buckets[:-1], 24]
    engine = StepEngine(backend, prefill_token_budget=4096)
    long_one = GenerationRequest(PROMPTS[0], 40, ignore_eos=True)
    short_one = GenerationRequest(PROMPTS[1], 8, ignore_eos=True)
    sequences = [
        Sequence(r, backend.encode(r.prompt), backend.tokenizer, backend.eos_token_ids, f"r{i}")
        for i, r in enumerate([long_one, short_one])
    ]
    for sequence in sequences:
        engine.submit(sequence)
    for _ in range(60):
        if all(s.finished for s in sequences):
            break
        engine.step()
    failed, served = sequences
    assert failed.error is not None and failed.error.param == "max_new_tokens" and failed.error.status == 400
    assert served.error is None and served.completion_tokens == 8
    assert issubclass(SlotRequestError, ValueError)
