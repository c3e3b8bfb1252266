"""LoRA on Inferentia2 (issue 43), piece by piece: the fake NxD Inference's multi-LoRA surface
(tests/fakes/neuronx_distributed_inference/modules/lora_serving, SDK 2.28 commit cd3abf3) with its real
defaults, errors and traps; the SDK-free helpers of handler/neuron/lora.py; the sim backend serving
adapter rows; neuronx's refusal. The nxdi backend on the fake: tests/integration/neuron/test_nxdi_lora.py."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file, save_file

from handler.backends.hf import DTYPE_KWARG
from handler.lora.adapters import read_adapter
from handler.neuron import lora as nxdi_lora
from handler.neuron.lora import BASE_ADAPTER, LoraSettings, NxdiLoraLayout
from handler.request import DecodeRow, SlotRequest, SlotRequestError
from tests.support.bench import PROFILE_7B, FakeClock, sim_model_yaml
from tests.support.lora import make_lora_adapter

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
FAKE_PACKAGES = ("neuronx_distributed_inference", "neuronx_distributed", "torch_neuronx")
PROMPT = [1, 20, 30, 40, 50]
pytestmark = pytest.mark.filterwarnings("ignore:neuronx_distributed_inference.models.config.get_platform_lnc")


@pytest.fixture(scope="module")
def made(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    root = tmp_path_factory.mktemp("lora-unit")
    return SimpleNamespace(
        a=make_lora_adapter(tiny_model_dir, root / "a", 1, scale=4.0),
        b=make_lora_adapter(tiny_model_dir, root / "b", 2, rank=4, scale=4.0),
        r1=make_lora_adapter(tiny_model_dir, root / "r1", 3, rank=1),
    )


def _purge() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in FAKE_PACKAGES:
            del sys.modules[name]


@pytest.fixture
def nxdi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path) -> Iterator[SimpleNamespace]:
    """The fake NxDI importable (as tests/unit/test_nxdi_fake.py has it), a LoRA model builder."""
    for name in ("NEURON_RT_VISIBLE_CORES", "NEURON_LOGICAL_NC_CONFIG", "FAKE_NXDI_VERSION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FAKE_NEURONX_CALL_LOG", str(tmp_path / "calls.jsonl"))
    monkeypatch.setenv("BASE_COMPILE_WORK_DIR", str(tmp_path / "nxd_work") + "/")
    monkeypatch.syspath_prepend(str(FAKES))
    _purge()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    config = importlib.import_module("neuronx_distributed_inference.models.config")
    llama = importlib.import_module("neuronx_distributed_inference.models.llama.modeling_llama")
    hf_adapter = importlib.import_module("neuronx_distributed_inference.utils.hf_adapter")
    lora = importlib.import_module("neuronx_distributed_inference.modules.lora_serving")
    shapes = nxdi_lora.llama_lora_shapes(json.loads((tiny_model_dir / "config.json").read_text()))
    assert shapes is not None
    base = nxdi_lora.write_base_adapter(tmp_path / "base", shapes, ["q_proj", "v_proj"])

    def compiled(
        paths: dict[str, Path],
        name: str = "out",
        batch: int = 2,
        presharded: bool = True,
        **lora_kwargs: Any,
    ) -> Any:
        """A model compiled with LoraServingConfig(lora_ckpt_paths=paths, batch_size=batch, **lora_kwargs)
        and `batch` slots, loaded from its folder."""
        lora_config = lora.LoraServingConfig(
            lora_ckpt_paths={key: str(path) for key, path in paths.items()}, **{"batch_size": batch, **lora_kwargs}
        )
        neuron_config = config.NeuronConfig(
            tp_degree=2,
            batch_size=batch,
            ctx_batch_size=1,
            is_continuous_batching=True,
            seq_len=64,
            max_context_length=32,
            enable_bucketing=True,
            context_encoding_buckets=[16, 32],
            token_generation_buckets=[64],
            torch_dtype=torch.float32,
            save_sharded_checkpoint=presharded,
            lora_config=lora_config,
        )
        hf_config = hf_adapter.load_pretrained_config(str(tiny_model_dir))
        inference = llama.LlamaInferenceConfig(neuron_config, load_config=hf_config)
        folder = tmp_path / name
        llama.NeuronLlamaForCausalLM(str(tiny_model_dir), inference).compile(str(folder))
        model = llama.NeuronLlamaForCausalLM(str(folder))
        model.load(str(folder))
        return model

    def calls(name: str) -> list[dict[str, Any]]:
        lines = (tmp_path / "calls.jsonl").read_text().splitlines()
        return [entry for entry in map(json.loads, lines) if entry["call"] == name]

    yield SimpleNamespace(lora=lora, config=config, compiled=compiled, calls=calls, base=base, tmp=tmp_path)
    torch.set_num_threads(threads)
    _purge()


def prefill(model: Any, slot: int, index: int, prompt: list[int] = PROMPT) -> torch.Tensor:
    out = model(
        input_ids=torch.tensor([prompt]),
        position_ids=torch.arange(len(prompt))[None],
        seq_ids=torch.tensor([slot], dtype=torch.int32),
        sampling_params=torch.ones(1, 3),
        adapter_ids=torch.tensor([index], dtype=torch.int32),
    )
    return out.logits[0, -1]


def decode(model: Any, tokens: list[int], position: int, adapter_ids: list[int]) -> torch.Tensor:
    rows = len(tokens)
    out = model(
        input_ids=torch.tensor([[t] for t in tokens]),
        position_ids=torch.full((rows, 1), position),
        seq_ids=torch.arange(rows, dtype=torch.int32),
        sampling_params=torch.ones(rows, 3),
        adapter_ids=torch.tensor(adapter_ids, dtype=torch.int32),
    )
    return out.logits[:, -1]


def peft_logits(checkpoint: Path, adapter: Path | None, ids: list[int]) -> torch.Tensor:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, **{DTYPE_KWARG: torch.float32})
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    with torch.inference_mode():
        return model.eval()(torch.tensor([ids])).logits[0, -1]


# -- the fake's LoraServingConfig: the real defaults, adjustments and errors ---------------------------
def test_lora_serving_config_defaults_and_what_it_reads_from_the_adapters(nxdi, made, caplog) -> None:
    config = nxdi.lora.LoraServingConfig(lora_ckpt_paths={"a": str(made.a), "b": str(made.b)})
    assert (config.max_lora_rank, config.max_cpu_loras, config.batch_size) == (16, 100, 1)
    assert (config.dynamic_multi_lora, config.eviction_policy, config.lfu_decay_period) == (False, "lru", 128)
    assert config.lora_memory_transpose and config.lora_shard_linear_layer and config.lora_bias == "none"
    assert config.max_loras == 2, "raised from its default 1 to the number of checkpoints (config.py:151-153)"
    assert sorted(config.target_modules) == ["q_proj", "v_proj"] and config.lora_ckpt_paths_cpu == {}
    listed = nxdi.lora.LoraServingConfig(lora_ckpt_paths=[f"a:{made.a}"], max_lora_rank=2, target_modules=["q_proj"])
    assert listed.lora_ckpt_paths == {"a": str(made.a)}
    assert listed.max_lora_rank == 8 and sorted(listed.target_modules) == ["q_proj", "v_proj"]  # raised, widened
    dynamic = nxdi.lora.LoraServingConfig(
        lora_ckpt_paths={"a": str(made.a)}, lora_ckpt_paths_cpu={"b": str(made.b)}, dynamic_multi_lora=True
    )
    assert list(dynamic.lora_ckpt_paths_cpu) == ["b", "a"]  # host paths | device paths (config.py:47)


def test_lora_serving_config_errors_are_the_real_ones(nxdi, made, tmp_path) -> None:
    LoraServingConfig = nxdi.lora.LoraServingConfig
    with pytest.raises(FileNotFoundError, match=r"LoRA adapter path /no/where for adapter ID a is not found"):
        LoraServingConfig(lora_ckpt_paths={"a": "/no/where"})
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "adapter_model.safetensors").write_bytes((made.a / "adapter_model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match="No LoRA configuration json file is found in"):
        LoraServingConfig(lora_ckpt_paths={"a": str(bare)})
    weird = tmp_path / "adapter.ckpt"
    weird.write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match=r"Invalid checkpoint filename .* for LoRA adapter"):
        LoraServingConfig(lora_ckpt_paths={"a": str(weird)})
    with pytest.raises(ValueError, match="maximum number of adapters that can be hosted on CPU is 1"):
        LoraServingConfig(
            lora_ckpt_paths={"a": str(made.a), "b": str(made.b)}, dynamic_multi_lora=True, max_cpu_loras=1
        )
    listing = tmp_path / "adapters.json"
    listing.write_text(json.dumps({"lora-ckpt-dir": str(made.a.parent), "lora-ckpt-paths": {"a": "a"}}))
    with pytest.raises(ValueError, match="The adapter ID a appears more than once in lora_ckpt_paths"):
        LoraServingConfig(lora_ckpt_json=str(listing), lora_ckpt_paths={"a": str(made.b)})


def test_convert_adapter_ids_to_indices_counts_rows_and_index_0_is_the_first_adapter(nxdi, made) -> None:
    config = nxdi.lora.LoraServingConfig(lora_ckpt_paths={"a": str(made.a), "b": str(made.b)})
    manager = nxdi.lora.LoraModelManager(config)
    assert manager.lora_adapter_id_mapping == {"a": 0, "b": 1}  # no index for the base model at 2.28
    assert manager.convert_adapter_ids_to_indices(["b", "a"], 2).tolist() == [1, 0]
    assert manager.convert_adapter_ids_to_indices(None, 3).tolist() == [0, 0, 0]
    with pytest.raises(
        ValueError, match="The number of LoRA adapter IDs is 3, but the maximum number of adapters is 2"
    ):
        manager.convert_adapter_ids_to_indices(["a", "a", "a"], 3)  # one distinct adapter, three rows
    with pytest.raises(ValueError, match="but it should equal the prompts number 1"):
        manager.convert_adapter_ids_to_indices(["a", "b"], 1)
    with pytest.raises(KeyError):
        manager.convert_adapter_ids_to_indices(["zz"], 1)


# -- the fake device: the index per row reaches the row -------------------------------------------
def test_each_row_runs_with_the_adapter_its_index_names(nxdi, made, tiny_model_dir) -> None:
    model = nxdi.compiled({BASE_ADAPTER: nxdi.base, "a": made.a, "b": made.b}, batch=3)
    for index, adapter in enumerate((None, made.a, made.b)):
        got = prefill(model, index, index)
        assert torch.allclose(got, peft_logits(tiny_model_dir, adapter, PROMPT), atol=1e-4)
    base = peft_logits(tiny_model_dir, None, PROMPT)
    assert not torch.allclose(prefill(model, 0, 1), base, atol=1e-3), "an adapter must change the logits"
    # token generation: the slots' adapters from their prefill, whatever the call's adapter_ids say
    for slot, index in enumerate((2, 0, 1)):
        prefill(model, slot, index)
    logits = decode(model, [7, 7, 7], len(PROMPT), [0, 0, 0])
    [program] = nxdi.calls("forward")[-1]["programs"]
    assert program["lora"] == [[0, 2], [1, 0], [2, 1]]  # [active row, the adapter index copied into it]
    for row, adapter in enumerate((made.b, None, made.a)):
        assert torch.allclose(logits[row], peft_logits(tiny_model_dir, adapter, [*PROMPT, 7]), atol=1e-4)


def test_an_index_outside_the_compiled_slots_fails(nxdi, made) -> None:
    model = nxdi.compiled({BASE_ADAPTER: nxdi.base, "a": made.a})
    with pytest.raises(IndexError, match="adapter index 2 is outside the 2 LoRA slots"):
        prefill(model, 0, 2)


def test_the_default_lora_batch_size_of_1_gives_every_slot_the_last_prefills_adapter(nxdi, made) -> None:
    """The trap the backend avoids by passing batch_size = n_slots: one active row, every seq_id
    clamped onto it (DynamicUpdateSlice), every decode row reading it."""
    assert nxdi.lora.LoraServingConfig(lora_ckpt_paths={"a": str(made.a)}).batch_size == 1  # the default
    model = nxdi.compiled({BASE_ADAPTER: nxdi.base, "a": made.a, "b": made.b}, batch=2, batch_size=1)
    prefill(model, 0, 1)
    prefill(model, 1, 2)
    decode(model, [7, 7], len(PROMPT), [1, 2])
    [program] = nxdi.calls("forward")[-1]["programs"]
    assert program["lora"] == [[0, 2], [0, 2]], "slot 0 runs with b, the adapter of slot 1's prefill"


def test_an_active_batch_neither_1_nor_the_batch_fails_to_compile(nxdi, made) -> None:
    with pytest.raises(RuntimeError, match=r"einsum\(\): subscript b has size 3 for operand 1"):
        nxdi.compiled({BASE_ADAPTER: nxdi.base, "a": made.a}, batch=2, batch_size=3)


def test_a_rank_1_adapter_fails_as_in_nxdi(nxdi, made) -> None:
    with pytest.raises(IndexError, match="tuple index out of range"):
        nxdi.compiled({BASE_ADAPTER: nxdi.base, "r1": made.r1})
    assert nxdi_lora.nxdi_rank_refusal("r1", 1) and nxdi_lora.nxdi_rank_refusal("a", 2) is None


def test_target_modules_the_model_lacks_fail_at_injection(nxdi, tmp_path) -> None:
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 4, "target_modules": ["w_proj"]}))
    save_file(
        {"base_model.model.model.layers.0.self_attn.w_proj.lora_A.weight": torch.zeros(4, 64)},
        str(odd / "x.safetensors"),
    )
    with pytest.raises(ValueError, match=r"Target modules \['w_proj'\] not found in the base model"):
        nxdi.compiled({"odd": odd})


def test_dynamic_multi_lora_swaps_through_a_device_slot_and_fails_with_presharded_host_copies(
    nxdi, made, tiny_model_dir
) -> None:
    paths = {BASE_ADAPTER: nxdi.base, "a": made.a}
    host = {key: str(path) for key, path in {**paths, "b": made.b}.items()}
    model = nxdi.compiled(
        paths, presharded=False, max_loras=2, max_cpu_loras=3, dynamic_multi_lora=True, lora_ckpt_paths_cpu=host
    )
    got = prefill(model, 0, 2)  # b lives in host memory only: swapped into a device slot
    assert torch.allclose(got, peft_logits(tiny_model_dir, made.b, PROMPT), atol=1e-4)
    forward = nxdi.calls("forward")[-1]
    assert forward["adapter_ids"] == [2] and forward["programs"][0]["lora"] == [[0, 2]]
    with pytest.raises(AssertionError):  # not in host memory: a bare assert (lora_model.py:522)
        prefill(model, 0, 5)
    presharded = nxdi.compiled(
        paths, name="pre", max_loras=2, max_cpu_loras=3, dynamic_multi_lora=True, lora_ckpt_paths_cpu=host
    )
    with pytest.raises(RuntimeError, match="expand"):  # each host copy is the whole stack, stacked again at load
        prefill(presharded, 0, 2)


# -- handler/neuron/lora.py ------------------------------------------------------------------------
def test_llama_shapes_settings_and_the_layout_nxdi_gets(tmp_path) -> None:
    qwen3 = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "intermediate_size": 96,
    }
    shapes = nxdi_lora.llama_lora_shapes(qwen3)
    assert shapes == {
        "q_proj": (64, 128),
        "k_proj": (64, 64),
        "v_proj": (64, 64),
        "o_proj": (128, 64),
        "gate_proj": (64, 96),
        "up_proj": (64, 96),
        "down_proj": (96, 64),
    }
    assert nxdi_lora.llama_lora_shapes({"hidden_size": 64}) is None
    with pytest.raises(ValueError, match="reserved"):
        LoraSettings.of({BASE_ADAPTER: tmp_path}, 2, 8)
    settings = LoraSettings.of({"a": tmp_path / "a", "b": tmp_path / "b", "c": tmp_path / "c"}, 1, 8)
    static = NxdiLoraLayout.build(settings, False, [8, 4, 4], ["v_proj", "q_proj"], tmp_path / "base", 4)
    assert static.names == (BASE_ADAPTER, "a", "b", "c")
    assert static.keywords["max_loras"] == 4 and static.keywords["batch_size"] == 4
    assert static.keywords["target_modules"] == ["q_proj", "v_proj"] and "lora_ckpt_paths_cpu" not in static.keywords
    dynamic = NxdiLoraLayout.build(settings, True, [8, 4, 4], ["q_proj"], tmp_path / "base", 4)
    assert list(dynamic.keywords["lora_ckpt_paths"]) == [BASE_ADAPTER, "a"] and dynamic.keywords["max_loras"] == 2
    assert (
        list(dynamic.keywords["lora_ckpt_paths_cpu"]) == list(dynamic.names) and dynamic.keywords["max_cpu_loras"] == 4
    )
    manifest = dynamic.manifest({name: {"f": name} for name in "abc"})
    assert "lora_ckpt_paths" not in manifest["nxdi"] and str(tmp_path) not in json.dumps(manifest)
    assert manifest["adapters"] == {"a": {"f": "a"}, "b": {"f": "b"}, "c": {"f": "c"}}


def test_the_base_adapter_is_zero_and_a_valid_peft_adapter(tmp_path, tiny_model_dir) -> None:
    shapes = nxdi_lora.llama_lora_shapes(json.loads((tiny_model_dir / "config.json").read_text()))
    assert shapes is not None
    folder = nxdi_lora.write_base_adapter(tmp_path / "base", shapes, ["v_proj", "q_proj"])
    spec = read_adapter(BASE_ADAPTER, folder, 8, shapes)
    assert spec.rank == nxdi_lora.BASE_RANK and spec.target_modules == ("q_proj", "v_proj")
    assert all(not tensor.any() for tensor in load_file(folder / "adapter_model.safetensors").values())


def test_adapter_identity_rehashes_only_a_file_whose_stat_changed(tmp_path, made, monkeypatch) -> None:
    adapter = tmp_path / "a"
    adapter.mkdir()
    for name in nxdi_lora.ADAPTER_FILES:
        (adapter / name).write_bytes((made.a / name).read_bytes())
    identity, stats = nxdi_lora.adapter_identity(adapter)
    hashed: list[str] = []
    real = nxdi_lora.file_sha256
    monkeypatch.setattr(nxdi_lora, "file_sha256", lambda path: hashed.append(path.name) or real(path))
    assert nxdi_lora.adapter_identity(adapter, {"identity": identity, "stats": stats})[0] == identity
    assert hashed == []
    (adapter / "adapter_model.safetensors").write_bytes((made.b / "adapter_model.safetensors").read_bytes())
    changed, _ = nxdi_lora.adapter_identity(adapter, {"identity": identity, "stats": stats})
    assert hashed == ["adapter_model.safetensors"] and changed != identity


def test_an_nxdi_without_the_keywords_this_backend_passes_is_refused(monkeypatch) -> None:
    from handler.backends import nxdi
    from handler.errors import ConfigError

    class Nxdi06LoraServingConfig:  # NxDI 0.6 (SDK 2.26): no batch_size, no dynamic multi-LoRA
        def __init__(self, max_loras: int = 1, max_lora_rank: int = 16, lora_ckpt_paths: Any = None) -> None:
            pass

    monkeypatch.setattr(
        nxdi.importlib, "import_module", lambda name: SimpleNamespace(LoraServingConfig=Nxdi06LoraServingConfig)
    )
    with pytest.raises(ConfigError, match=r"lacks batch_size, dynamic_multi_lora, .*needs NxD Inference 0\.7\+"):
        nxdi.lora_serving_config_cls()


# -- sim ---------------------------------------------------------------------------------------------
def sim_backend(model_dir: Path, tmp_path: Path, lora_step_ms: float = 0.0) -> Any:
    from handler.backends.sim import SimBackend
    from handler.config import ServingConfig

    profile = yaml.safe_load(PROFILE_7B.read_text())
    profile["lora_step_ms"] = lora_step_ms
    (tmp_path / "profile.yaml").write_text(yaml.safe_dump(profile))
    config = ServingConfig.from_model_yaml(
        sim_model_yaml(model_dir, profile=str(tmp_path / "profile.yaml"), time_scale=1.0)
    )
    return SimBackend(config.handler, model_dir, model_dir, clock=FakeClock())


def test_sim_serves_adapter_rows_and_charges_the_profiles_lora_step(tiny_model_dir, tmp_path, made) -> None:
    backend = sim_backend(tiny_model_dir, tmp_path, lora_step_ms=2.0)
    shapes = backend.lora_shapes()
    assert shapes is not None and shapes["q_proj"] == (64, 64)
    backend.load_adapter(read_adapter("a", made.a, 8, shapes))
    backend.load_adapter(read_adapter("b", made.b, 8, shapes))
    prompt = tuple(range(10, 30))
    with pytest.raises(SlotRequestError, match="serves no LoRA adapter 'zz'") as refused:
        backend.prefill([SlotRequest(0, prompt, ignore_eos=True, adapter_id="zz")])
    assert refused.value.param == "model"
    requests = [
        SlotRequest(slot, prompt, ignore_eos=True, adapter_id=name) for slot, name in enumerate((None, "a", "b", "a"))
    ]
    firsts = [choice.token_id for choice in backend.prefill(requests)]
    clock = backend.model.clock
    charged = len(clock.charged)
    rows = [DecodeRow(r.slot, adapter_id=r.adapter_id) for r in requests]
    tokens = [
        [first, *(c.token_id for c in choices)]
        for first, choices in zip(firsts, backend.decode_plan(rows), strict=True)
    ]
    assert tokens[1] == tokens[3] and tokens[0] != tokens[1] != tokens[2]  # the adapter's own draw, per row
    [step] = clock.charged[charged:]
    assert step == pytest.approx(backend.profile.decode_s(4) + 2 * 0.002)  # two distinct adapters
    with pytest.raises(SlotRequestError, match="prefilled with 'a'"):
        backend.decode_plan([DecodeRow(0), DecodeRow(1), DecodeRow(2, adapter_id="b"), DecodeRow(3, adapter_id="a")])
    with pytest.raises(ValueError, match="still in use by slot"):
        backend.unload_adapter("b")
    backend.release(2)
    backend.unload_adapter("b")
    with pytest.raises(SlotRequestError, match="serves no LoRA adapter 'b'"):
        backend.prefill([SlotRequest(2, prompt, adapter_id="b")])


def test_a_profile_without_lora_step_ms_charges_nothing_for_adapters(tiny_model_dir, tmp_path, made) -> None:
    backend = sim_backend(tiny_model_dir, tmp_path)
    backend.load_adapter(read_adapter("a", made.a, 8, backend.lora_shapes()))
    backend.prefill([SlotRequest(0, (5, 6, 7), adapter_id="a")])
    clock = backend.model.clock
    backend.decode_plan([DecodeRow(0, adapter_id="a")])
    assert clock.charged[-1] == pytest.approx(backend.profile.decode_s(1))


# -- neuronx --------------------------------------------------------------------------------------
def test_neuronx_refuses_adapters_naming_nxdi_and_hf() -> None:
    from handler.backends.device_slots import LiveSlots
    from handler.backends.neuronx import LORA_REFUSAL, NeuronxBackend

    assert "backend nxdi" in LORA_REFUSAL and "backend hf" in LORA_REFUSAL and "handler.lora" in LORA_REFUSAL
    stub = SimpleNamespace(_live=LiveSlots("neuronx", 2, 64, "trap"), context_buckets=[16])
    with pytest.raises(SlotRequestError, match="serves no LoRA adapters") as refused:
        NeuronxBackend.prefill(stub, [SlotRequest(1, (3, 4), adapter_id="a")])  # type: ignore[arg-type]
    assert refused.value.slot == 1 and refused.value.param == "model"
    with pytest.raises(NotImplementedError, match="use backend nxdi"):
        NeuronxBackend.load_adapter(stub, None)  # type: ignore[arg-type]
    assert NeuronxBackend.lora_shapes(stub) is None  # type: ignore[arg-type]
