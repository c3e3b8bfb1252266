"""The fake NxD Inference (tests/fakes/neuronx_distributed_inference, SDK 2.28 / NxDI 0.8.16251)
models the rules and traps the nxdi backend is designed around; each test proves one on the
fake directly, with the tiny Llama checkpoint on CPU. The fake's README section lists the real
source each rule comes from."""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import logging
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
FAKE_PACKAGES = ("neuronx_distributed_inference", "neuronx_distributed", "torch_neuronx")
ENV = (
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
    "NEURON_LOGICAL_NC_CONFIG",
    "FAKE_NXD_COMPILE_DELAY_S",
    "FAKE_NXDI_VERSION",
    "FAKE_NXD_VERSION",
    "FAKE_TORCH_NEURONX_VERSION",
    "FAKE_NEURONX_HOLD_FILE",
)
PROMPTS = ["Hello world, this is", "The quick brown fox jumps over the lazy dog and", "Once upon"]
FINFO_MIN = torch.finfo(torch.float32).min
# every NeuronConfig() calls NxDI's deprecated get_platform_lnc(), as the real one does
pytestmark = pytest.mark.filterwarnings("ignore:neuronx_distributed_inference.models.config.get_platform_lnc")


def _purge() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in FAKE_PACKAGES:
            del sys.modules[name]


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path) -> Any:
    """The fake SDK importable (as tests/support/neuron.py does), a private compiler work dir and
    call log; yields the modules a backend imports plus helpers."""
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_NEURONX_CALL_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("BASE_COMPILE_WORK_DIR", str(tmp_path / "nxd_work") + "/")
    monkeypatch.syspath_prepend(str(FAKES))
    _purge()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the tiny model's forwards are far faster on one thread, on a busy host above all
    config = importlib.import_module("neuronx_distributed_inference.models.config")
    llama = importlib.import_module("neuronx_distributed_inference.models.llama.modeling_llama")
    hf_adapter = importlib.import_module("neuronx_distributed_inference.utils.hf_adapter")

    def build(checkpoint: Path = tiny_model_dir, **kwargs: Any) -> Any:
        options = {
            "tp_degree": 2,
            "batch_size": 4,
            "ctx_batch_size": 1,
            "is_continuous_batching": True,
            "seq_len": 256,
            "max_context_length": 128,
            "enable_bucketing": True,
            "torch_dtype": "bfloat16",
            **kwargs,
        }
        neuron_config = config.NeuronConfig(**options)
        inference_config = llama.LlamaInferenceConfig(
            neuron_config, load_config=hf_adapter.load_pretrained_config(str(checkpoint))
        )
        return llama.NeuronLlamaForCausalLM(str(checkpoint), inference_config)

    def compiled(name: str = "compiled", checkpoint: Path = tiny_model_dir, **kwargs: Any) -> Any:
        folder = tmp_path / name
        build(checkpoint, **kwargs).compile(str(folder))
        model = llama.NeuronLlamaForCausalLM(str(folder))
        model.load(str(folder))
        return model

    def calls(name: str) -> list[dict[str, Any]]:
        lines = (tmp_path / "calls.jsonl").read_text().splitlines()
        return [entry for entry in map(json.loads, lines) if entry["call"] == name]

    yield SimpleNamespace(
        config=config,
        llama=llama,
        hf_adapter=hf_adapter,
        build=build,
        compiled=compiled,
        calls=calls,
        tmp=tmp_path,
        tiny=tiny_model_dir,
    )
    torch.set_num_threads(threads)
    _purge()


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    prompts = [tokenizer(text, return_tensors="pt").input_ids[0] for text in PROMPTS]
    assert all(len(ids) >= 2 for ids in prompts)
    return SimpleNamespace(tokenizer=tokenizer, model=model, prompts=prompts)


def hf_greedy(hf: Any, ids: torch.Tensor, count: int) -> list[int]:
    out = hf.model.generate(ids[None], max_new_tokens=count, do_sample=False, eos_token_id=None, pad_token_id=3)
    tokens = out[0, len(ids) :].tolist()
    assert len(tokens) == count
    return tokens


def hf_logits(hf: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return hf.model(torch.tensor([ids])).logits[0, -1].float()


class Driver:
    """A minimal serving loop over the fake: prefill one prompt per call, then decode."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prompt: dict[int, int] = {}
        self.tokens: dict[int, list[int]] = {}

    def prefill(self, slot: int, ids: torch.Tensor) -> None:
        out = self.model(
            ids[None],
            position_ids=torch.arange(len(ids))[None],
            seq_ids=torch.tensor([slot], dtype=torch.int32),
            sampling_params=torch.tensor([[1.0, 1.0, 1.0]]),
        )
        self.prompt[slot] = len(ids)
        self.tokens[slot] = [int(out.logits[0, -1].argmax())]

    def decode(self, rows: list[int], seq_ids: list[int] | None = None) -> None:
        """One decode call whose row r is slot rows[r]; seq_ids defaults to rows."""
        out = self.model(
            torch.tensor([[self.tokens[slot][-1]] for slot in rows]),
            position_ids=torch.tensor([[self.prompt[slot] + len(self.tokens[slot]) - 1] for slot in rows]),
            seq_ids=torch.tensor(rows if seq_ids is None else seq_ids, dtype=torch.int32),
            sampling_params=torch.ones(len(rows), 3),
        )
        for row, slot in enumerate(rows):
            self.tokens[slot].append(int(out.logits[row, 0].argmax()))


# -- configuration --------------------------------------------------------------------------
def test_neuron_config_unknown_keyword_is_only_logged(nxdi: Any, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = nxdi.config.NeuronConfig(tp_degree=2, batch_sizee=4)  # a typo: not an error
    assert "NeuronConfig init: Unexpected keyword arguments: {'batch_sizee': 4}" in caplog.text
    assert config.batch_size == 1 and not hasattr(config, "batch_sizee")
    # the real defaults the backend leans on
    config = nxdi.config.NeuronConfig(batch_size=4)
    assert (config.ctx_batch_size, config.tkg_batch_size, config.max_batch_size) == (4, 4, 4)
    assert (config.seq_len, config.max_context_length, config.max_length) == (128, 128, 128)
    assert config.torch_dtype == torch.bfloat16 and not config.overrides_torch_dtype
    assert not config.is_continuous_batching and not config.enable_bucketing and not config.apply_seq_ids_mask
    assert config.padding_side == "right" and not config.skip_warmup and not config.save_sharded_checkpoint
    sampling = nxdi.config.OnDeviceSamplingConfig()
    assert (sampling.do_sample, sampling.dynamic, sampling.deterministic) == (False, False, False)
    assert (sampling.top_k, sampling.top_p, sampling.temperature, sampling.global_topk) == (1, 1.0, 1.0, 256)


def test_neuron_config_real_validations_raise(nxdi: Any) -> None:
    NeuronConfig = nxdi.config.NeuronConfig
    with pytest.raises(AssertionError, match="max_context_length cannot be more than max_length"):
        NeuronConfig(seq_len=128, max_context_length=256)
    with pytest.raises(AssertionError, match="Context bucket 256 should be <= 128"):
        NeuronConfig(seq_len=256, max_context_length=128, context_encoding_buckets=[256])
    with pytest.raises(ValueError, match="cast_type must be one of"):
        NeuronConfig(cast_type="auto")
    with pytest.raises(ValueError, match="TP Degree must be evenly divisible by CP Degree"):
        NeuronConfig(tp_degree=2, cp_degree=4)
    with pytest.raises(ValueError, match="--is-continuous-batching must be enabled when running DP"):
        NeuronConfig(tp_degree=2, attention_dp_degree=2, batch_size=2)
    buckets = [256, 128]
    NeuronConfig(seq_len=256, enable_bucketing=True, token_generation_buckets=buckets)
    assert buckets == [128, 256]  # sorted in place, as the real one does


def test_ctx_batch_size_must_be_one_under_continuous_batching(nxdi: Any) -> None:
    model = nxdi.build(ctx_batch_size=4)  # the default is batch_size
    with pytest.raises(AssertionError, match="only supports single seq_id"):
        model.compile(str(nxdi.tmp / "out"))


def test_hf_dtype_replaces_the_default_torch_dtype(nxdi: Any) -> None:
    implicit = nxdi.llama.LlamaInferenceConfig(
        nxdi.config.NeuronConfig(), load_config=nxdi.hf_adapter.load_pretrained_config(str(nxdi.tiny))
    )
    assert implicit.neuron_config.torch_dtype == torch.float32  # the checkpoint's dtype
    assert implicit._name_or_path == str(nxdi.tiny)
    explicit = nxdi.llama.LlamaInferenceConfig(
        nxdi.config.NeuronConfig(torch_dtype="bfloat16"),
        load_config=nxdi.hf_adapter.load_pretrained_config(str(nxdi.tiny)),
    )
    assert explicit.neuron_config.torch_dtype == torch.bfloat16


# -- compile and load ---------------------------------------------------------------------
def test_compile_writes_config_and_model_only_without_sharding(nxdi: Any) -> None:
    folder = nxdi.tmp / "out"
    nxdi.build().compile(str(folder))
    assert sorted(os.listdir(folder)) == ["model.pt", "neuron_config.json"]
    saved = json.loads((folder / "neuron_config.json").read_text())
    assert saved["neuron_config"]["tp_degree"] == 2 and saved["neuron_config"]["torch_dtype"] == "bfloat16"
    assert saved["_name_or_path"] == str(nxdi.tiny)
    model_pt = (folder / "model.pt").read_bytes()
    spec = json.loads(model_pt.split(b"\n", 1)[1])
    assert {tag: [p["bucket"] for p in programs] for tag, programs in spec["programs"].items()} == {
        "context_encoding_model": [128],
        "token_generation_model": [128, 256],
    }
    assert [p["batch_size"] for p in spec["programs"]["token_generation_model"]] == [4, 4]
    assert not nxdi.calls("shard_checkpoint")  # a compile without sharding never reads the weights
    [compile_call] = nxdi.calls("compile")
    assert compile_call["buckets"] == {"context_encoding_model": [128], "token_generation_model": [128, 256]}


def test_compile_with_sharding_writes_one_file_per_rank(nxdi: Any) -> None:
    folder = nxdi.tmp / "out"
    nxdi.build(tp_degree=4, save_sharded_checkpoint=True).compile(str(folder))
    assert sorted(os.listdir(folder / "weights")) == [f"tp{rank}_sharded_checkpoint.safetensors" for rank in range(4)]


def test_compile_wipes_the_scratch_dir_first(nxdi: Any) -> None:
    work = Path(os.environ["BASE_COMPILE_WORK_DIR"])
    work.mkdir(parents=True)
    (work / "someone-elses-file").write_text("x")
    nxdi.build().compile(str(nxdi.tmp / "out"))
    assert not (work / "someone-elses-file").exists()
    assert (work / "context_encoding_model" / "_tp0_bk0" / "model.neff").is_file()
    assert (work / "token_generation_model" / "_tp0_bk1" / "model.neff").is_file()


def test_two_compiles_sharing_a_scratch_dir_break_each_other(nxdi: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_NXD_COMPILE_DELAY_S", "0.6")
    work = Path(os.environ["BASE_COMPILE_WORK_DIR"])
    first, second = nxdi.build(), nxdi.build()
    errors: list[BaseException] = []

    def compile_first() -> None:
        try:
            first.compile(str(nxdi.tmp / "first"))
        except BaseException as error:
            errors.append(error)

    thread = threading.Thread(target=compile_first)
    thread.start()
    deadline = time.monotonic() + 5
    while not (work / "token_generation_model" / "_tp0_bk1").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    second.compile(str(nxdi.tmp / "second"))  # wipes the first compile's scratch files
    thread.join()
    assert len(errors) == 1 and isinstance(errors[0], RuntimeError) and "another" in str(errors[0])
    assert (nxdi.tmp / "second" / "model.pt").is_file()


def test_load_errors(nxdi: Any) -> None:
    llama = nxdi.llama
    with pytest.raises(FileNotFoundError):
        llama.NeuronLlamaForCausalLM(str(nxdi.tmp / "nothing-here"))
    folder = nxdi.tmp / "out"
    nxdi.build().compile(str(folder))
    (folder / "model.pt").unlink()
    model = llama.NeuronLlamaForCausalLM(str(folder))
    with pytest.raises(ValueError, match="does not exist"):
        model.load(str(folder))
    sharded = nxdi.tmp / "sharded"
    nxdi.build(save_sharded_checkpoint=True).compile(str(sharded))
    (sharded / "weights" / "tp1_sharded_checkpoint.safetensors").unlink()
    with pytest.raises(FileNotFoundError):
        llama.NeuronLlamaForCausalLM(str(sharded)).load(str(sharded))
    with pytest.raises(RuntimeError, match="Forward called before load"):
        llama.NeuronLlamaForCausalLM(str(sharded))(
            torch.ones(1, 4, dtype=torch.long), position_ids=torch.arange(4)[None]
        )


def test_load_reshards_from_the_checkpoint_unless_sharded(nxdi: Any) -> None:
    checkpoint = nxdi.tmp / "checkpoint"
    shutil.copytree(nxdi.tiny, checkpoint)
    nxdi.compiled("plain", checkpoint=checkpoint)
    [reshard] = nxdi.calls("shard_checkpoint")
    assert reshard["source"] == str(checkpoint) and reshard["reason"] == "load"
    assert nxdi.calls("load")[-1]["weights"] == "resharded"
    nxdi.build(checkpoint, save_sharded_checkpoint=True).compile(str(nxdi.tmp / "sharded"))
    shutil.rmtree(checkpoint)  # presharded weights need no checkpoint at load
    model = nxdi.llama.NeuronLlamaForCausalLM(str(nxdi.tmp / "sharded"))
    model.load(str(nxdi.tmp / "sharded"))
    assert nxdi.calls("load")[-1]["weights"] == "presharded"
    with pytest.raises(FileNotFoundError, match=r"Can not find model\.safetensors or pytorch_model\.bin"):
        nxdi.llama.NeuronLlamaForCausalLM(str(nxdi.tmp / "plain")).load(str(nxdi.tmp / "plain"))
    assert nxdi.calls("shard_checkpoint")[-1]["source"] == str(nxdi.tmp / "plain") + "/"


def test_load_warms_up_unless_skipped_and_needs_enough_cores(nxdi: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = nxdi.tmp / "out"
    nxdi.build(tp_degree=2).compile(str(folder))
    nxdi.llama.NeuronLlamaForCausalLM(str(folder)).load(str(folder))
    assert nxdi.calls("warmup") and nxdi.calls("load")[-1]["warmup"] is True
    nxdi.llama.NeuronLlamaForCausalLM(str(folder)).load(str(folder), skip_warmup=True)
    assert nxdi.calls("load")[-1]["warmup"] is False and len(nxdi.calls("warmup")) == 1
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "3")
    with pytest.raises(RuntimeError, match="fewer NeuronCores"):
        nxdi.llama.NeuronLlamaForCausalLM(str(folder)).load(str(folder))
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-3")
    nxdi.llama.NeuronLlamaForCausalLM(str(folder)).load(str(folder))
    assert nxdi.calls("load")[-1]["visible_cores"] == "2-3"


def test_model_classes_and_versions(nxdi: Any) -> None:
    qwen2 = importlib.import_module("neuronx_distributed_inference.models.qwen2.modeling_qwen2")
    qwen3 = importlib.import_module("neuronx_distributed_inference.models.qwen3.modeling_qwen3")
    load = nxdi.hf_adapter.load_pretrained_config(str(nxdi.tiny))
    with pytest.raises(ValueError, match="cannot serve a 'llama' checkpoint"):
        qwen2.NeuronQwen2ForCausalLM(
            str(nxdi.tiny),
            qwen2.Qwen2InferenceConfig(qwen2.Qwen2NeuronConfig(is_continuous_batching=True), load_config=load),
        )
    assert qwen3.NeuronQwen3ForCausalLM.get_config_cls() is qwen3.Qwen3InferenceConfig
    with pytest.raises(ModuleNotFoundError):  # SDK 2.28 has no mistral package: Mistral runs as Llama
        importlib.import_module("neuronx_distributed_inference.models.mistral.modeling_mistral")
    with pytest.raises(NotImplementedError, match="is_continuous_batching=False"):
        nxdi.build(is_continuous_batching=False)
    versions = {name: importlib.import_module(name).__version__ for name in FAKE_PACKAGES}
    assert versions == {
        "neuronx_distributed_inference": "0.8.16251+fake",
        "neuronx_distributed": "0.17.26814+fake",
        "torch_neuronx": "2.9.0.2.12.22436+fake",
    }
    for distribution in ("neuronx-distributed-inference", "neuronx-distributed", "torch-neuronx"):
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(distribution)


# -- serving ----------------------------------------------------------------------------------
def test_correct_driver_reproduces_hf_greedy(nxdi: Any, hf: Any) -> None:
    steps = 10
    driver = Driver(nxdi.compiled())
    driver.prefill(0, hf.prompts[0])
    driver.decode([0])
    driver.prefill(2, hf.prompts[1])  # slots need not be filled in order
    for _ in range(3):
        driver.decode([0, 2])
    driver.prefill(1, hf.prompts[2])
    while any(len(tokens) < steps for tokens in driver.tokens.values()):
        driver.decode(sorted(slot for slot, tokens in driver.tokens.items() if len(tokens) < steps))
    for slot, prompt in enumerate([0, 2, 1]):
        assert driver.tokens[slot][:steps] == hf_greedy(hf, hf.prompts[prompt], steps)
    decode = nxdi.calls("forward")[-1]
    assert decode["kind"] == "decode" and decode["programs"][0]["tag"] == "token_generation_model"


def test_leaving_a_live_slot_out_of_a_decode_corrupts_it(nxdi: Any, hf: Any) -> None:
    steps = 12
    texts = {}
    for masked in (False, True):
        driver = Driver(nxdi.compiled(f"m{masked}", apply_seq_ids_mask=masked))
        driver.prefill(0, hf.prompts[1])  # the longer prompt: its positions 0..12 are live
        driver.prefill(1, hf.prompts[0])
        driver.decode([1])  # slot 0 left out: NxDI runs it as a copy of row 0 (slot 1), at slot 1's position
        last = nxdi.calls("forward")[-1]
        assert last["filled_seq_ids"] == [0, 2, 3]
        assert last["overwritten"] == ([] if masked else [[0, len(hf.prompts[0])]])
        while len(driver.tokens[0]) < steps:
            driver.decode([0, 1])
        texts[masked] = driver.tokens[0][:steps]
    expected = hf_greedy(hf, hf.prompts[1], steps)
    assert texts[True] == expected
    assert texts[False] != expected


def test_a_full_batch_ignores_seq_ids(nxdi: Any, hf: Any) -> None:
    steps = 8
    driver = Driver(nxdi.compiled(batch_size=2))
    driver.prefill(0, hf.prompts[0])
    driver.prefill(1, hf.prompts[1])
    while len(driver.tokens[0]) < steps:
        driver.decode([1, 0])  # rows not sorted by slot: row 0 (slot 1) runs on KV line 0
    assert nxdi.calls("forward")[-1]["seq_ids_ignored"] is True
    assert driver.tokens[0][:steps] != hf_greedy(hf, hf.prompts[0], steps)
    assert driver.tokens[1][:steps] != hf_greedy(hf, hf.prompts[1], steps)


def test_a_partial_batch_answers_in_the_callers_order(nxdi: Any, hf: Any) -> None:
    steps = 6
    driver = Driver(nxdi.compiled(batch_size=3))
    driver.prefill(0, hf.prompts[0])
    driver.prefill(2, hf.prompts[1])
    while len(driver.tokens[0]) < steps:
        driver.decode([2, 0])  # slot 1 is free: overwriting it is harmless
    assert driver.tokens[0][:steps] == hf_greedy(hf, hf.prompts[0], steps)
    assert driver.tokens[2][:steps] == hf_greedy(hf, hf.prompts[1], steps)


def test_two_prompts_in_one_prefill_run_one_at_a_time(nxdi: Any, hf: Any) -> None:
    model = nxdi.compiled()
    first, second = hf.prompts[0], hf.prompts[1]
    width = max(len(first), len(second))
    ids = torch.zeros(2, width, dtype=torch.long)
    positions = torch.zeros(2, width, dtype=torch.long)  # padding positions 0: each row ends at its own max
    for row, prompt in enumerate((first, second)):
        ids[row, : len(prompt)] = prompt
        positions[row, : len(prompt)] = torch.arange(len(prompt))
    out = model(ids, position_ids=positions, seq_ids=torch.tensor([0, 1]), sampling_params=torch.ones(2, 3))
    assert torch.allclose(out.logits[0, 0], hf_logits(hf, first.tolist()), atol=1e-4)
    assert torch.allclose(out.logits[1, 0], hf_logits(hf, second.tolist()), atol=1e-4)
    programs = nxdi.calls("forward")[-1]["programs"]
    assert [(p["tag"], p["batch_size"], p["seq_ids"]) for p in programs] == [
        ("context_encoding_model", 1, [0]),
        ("context_encoding_model", 1, [1]),
    ]


def test_bucket_selection(nxdi: Any) -> None:
    autobucketing = importlib.import_module("neuronx_distributed_inference.modules.autobucketing")
    assert autobucketing.generate_buckets(128, 256) == [128, 256]
    assert autobucketing.generate_buckets(128, 400) == [128, 256, 400]
    assert autobucketing.generate_buckets(128, 100) == [100]
    model = nxdi.compiled(seq_len=512, max_context_length=256)

    def prefill_bucket(length: int) -> int:
        model(
            torch.full((1, length), 5),
            position_ids=torch.arange(length)[None],
            seq_ids=torch.tensor([0]),
            sampling_params=torch.ones(1, 3),
        )
        return nxdi.calls("forward")[-1]["programs"][0]["bucket"]

    assert [prefill_bucket(n) for n in (127, 128, 255, 256)] == [128, 256, 256, 256]  # strictly longer, or the largest
    with pytest.raises(ValueError, match="Input len 257 exceeds largest bucket \\(256\\) for context_encoding_model"):
        prefill_bucket(257)

    def decode_bucket(position: int) -> int:
        model(
            torch.tensor([[5]]),
            position_ids=torch.tensor([[position]]),
            seq_ids=torch.tensor([0]),
            sampling_params=torch.ones(1, 3),
        )
        return nxdi.calls("forward")[-1]["programs"][0]["bucket"]

    assert [decode_bucket(p) for p in (127, 128, 300, 511)] == [128, 256, 512, 512]


def test_one_token_prompt_reads_the_first_pad_position(nxdi: Any, hf: Any) -> None:
    model = nxdi.compiled()
    token = int(hf.prompts[0][0])
    out = model(
        torch.tensor([[token]]),
        position_ids=torch.tensor([[0]]),
        seq_ids=torch.tensor([0]),
        sampling_params=torch.ones(1, 3),
    )
    pad = hf.model.config.pad_token_id
    assert torch.allclose(out.logits[0, 0], hf_logits(hf, [token, pad]), atol=1e-4)  # index 1: a pad token
    # padding it oneself with position 0 (mask of width 1 picks the bucket) reads index 0
    ids = torch.full((1, 128), pad)
    ids[0, 0] = token
    out = model(
        ids,
        attention_mask=torch.ones(1, 1, dtype=torch.int32),
        position_ids=torch.zeros(1, 128, dtype=torch.long),
        seq_ids=torch.tensor([0]),
        sampling_params=torch.ones(1, 3),
    )
    assert torch.allclose(out.logits[0, 0], hf_logits(hf, [token]), atol=1e-4)


def test_logits_shape_and_the_masked_padding_columns(nxdi: Any, hf: Any) -> None:
    prompt = hf.prompts[0]
    inputs = {
        "position_ids": torch.arange(len(prompt))[None],
        "seq_ids": torch.tensor([0]),
        "sampling_params": torch.ones(1, 3),
    }
    out = nxdi.compiled("tp2", tp_degree=2)(prompt[None], **inputs)
    assert out.logits.shape == (1, 1, 512) and out.logits.dtype == torch.float32
    assert out.tokens is out.logits and out.hidden_states is out.logits
    assert bool((out.logits > FINFO_MIN).all())
    out = nxdi.compiled("tp24", tp_degree=24)(prompt[None], **inputs)  # 512 % 24 = 8: 16 padding columns
    assert out.logits.shape == (1, 1, 512)
    assert bool((out.logits[0, 0, 496:] == FINFO_MIN).all()) and bool((out.logits[0, 0, :496] > FINFO_MIN).all())
    sampling = nxdi.config.OnDeviceSamplingConfig()
    out = nxdi.compiled("ods24", tp_degree=24, on_device_sampling_config=sampling, output_logits=True)(
        prompt[None], **inputs
    )
    assert out.logits.shape == (1, 1, 528) and bool((out.logits[0, 0, 512:] == FINFO_MIN).all())
    assert out.tokens.dtype == torch.int32 and out.tokens.shape == (1,)


def test_sampling_params_must_fit_the_program(nxdi: Any, hf: Any) -> None:
    model = nxdi.compiled()
    prompt = hf.prompts[0]
    with pytest.raises(ValueError, match="not found in input_shape_map"):  # default params: (batch_size, 3) rows
        model(prompt[None], position_ids=torch.arange(len(prompt))[None], seq_ids=torch.tensor([0]))


# -- on-device sampling -----------------------------------------------------------------------
def _ods_decode(model: Any, hf: Any, params: list[list[float]]) -> list[int]:
    """Prefill the first prompt into every slot named by params' rows, then one decode of all rows."""
    prompt = hf.prompts[0]
    for slot in range(len(params)):
        model(
            prompt[None],
            position_ids=torch.arange(len(prompt))[None],
            seq_ids=torch.tensor([slot]),
            sampling_params=torch.tensor([params[slot]]),
        )
    greedy = int(hf_logits(hf, prompt.tolist()).argmax())
    out = model(
        torch.full((len(params), 1), greedy),
        position_ids=torch.full((len(params), 1), len(prompt)),
        seq_ids=torch.arange(len(params)),
        sampling_params=torch.tensor(params),
    )
    assert out.logits is None and out.tokens.dtype == torch.int32 and out.tokens.shape == (len(params),)
    return out.tokens.tolist()


def test_on_device_sampling_honours_rows_only_when_dynamic(nxdi: Any, hf: Any) -> None:
    prompt = hf.prompts[0]
    greedy = int(hf_logits(hf, [*prompt.tolist(), int(hf_logits(hf, prompt.tolist()).argmax())]).argmax())
    rows = [[1, 1.0, 1.0], [50, 1.0, 1.0], [50, 1.0, 0.001], [50, 1.0, 20.0]]
    ODS = nxdi.config.OnDeviceSamplingConfig
    static_greedy = _ods_decode(nxdi.compiled("greedy", on_device_sampling_config=ODS()), hf, rows)
    assert static_greedy == [greedy] * 4  # without do_sample and dynamic: argmax, whatever the rows say
    static = _ods_decode(
        nxdi.compiled("static", on_device_sampling_config=ODS(do_sample=True, deterministic=True)), hf, rows
    )
    assert static[2] == static[3]  # trace-time temperature 1.0: the rows' temperatures are ignored
    dynamic = _ods_decode(
        nxdi.compiled("dynamic", on_device_sampling_config=ODS(dynamic=True, deterministic=True)), hf, rows
    )
    assert dynamic[0] == greedy  # top_k 1
    assert dynamic[2] == greedy  # temperature 0.001: greedy in effect
    assert dynamic[3] != dynamic[2]  # temperature 20: the median draw lands elsewhere


def test_top_k_above_global_topk_raises(nxdi: Any, hf: Any) -> None:
    ODS = nxdi.config.OnDeviceSamplingConfig
    model = nxdi.compiled(on_device_sampling_config=ODS(dynamic=True, global_topk=64))
    prompt = hf.prompts[0]
    with pytest.raises(ValueError, match="Invalid top-k values found"):
        model(
            prompt[None],
            position_ids=torch.arange(len(prompt))[None],
            seq_ids=torch.tensor([0]),
            sampling_params=torch.tensor([[65.0, 1.0, 1.0]]),
        )
    params = torch.tensor([[-1.0, 1.0, 0.0]])
    with pytest.raises(ValueError, match="Temperature = 0 enables greedy sampling"):
        model(
            prompt[None],
            position_ids=torch.arange(len(prompt))[None],
            seq_ids=torch.tensor([0]),
            sampling_params=params,
        )
    params = torch.tensor([[40.0, 0.5, 0.0]])
    model(prompt[None], position_ids=torch.arange(len(prompt))[None], seq_ids=torch.tensor([0]), sampling_params=params)
    assert params.tolist() == [[1.0, 1.0, 0.0]]  # temperature 0 rewrote the caller's row in place


def test_hold_hook_waits_at_the_configured_decode_step(nxdi: Any, hf: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    hold = nxdi.tmp / "hold"
    hold.write_text("")
    monkeypatch.setenv("FAKE_NEURONX_HOLD_FILE", str(hold))
    monkeypatch.setenv("FAKE_NEURONX_HOLD_AT_STEP", "2")
    monkeypatch.setenv("FAKE_NEURONX_HOLD_MAX_S", "0.05")
    driver = Driver(nxdi.compiled())
    driver.prefill(0, hf.prompts[0])
    driver.decode([0])
    assert not nxdi.calls("hold")
    driver.decode([0])
    assert [call["step"] for call in nxdi.calls("hold")] == [2]
    assert nxdi.calls("release")[0]["timed_out"] is True
    assert nxdi.calls("forward")[-1]["sampling_params"] == [[1.0, 1.0, 1.0]]
