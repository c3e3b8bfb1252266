"""LoRA adapters on the nxdi backend (issue 43), on the fake NxD Inference's multi-LoRA
(tests/fakes/neuronx_distributed_inference/modules/lora_serving, SDK 2.28): the backend compiles with
`LoraServingConfig`, sends every call the rows' adapter indices it built itself, binds each slot's
adapter at its prefill, and never serves an adapter file that changed since the compile.

The fake really applies the adapters (x @ lora_A @ lora_B on the tiny Llama's projections, as NxDI's
MultiLoraLinear does), so a greedy row's tokens must be PEFT's for its adapter, whoever its batch-mates."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.lora.adapters import read_adapter
from handler.neuron.lora import BASE_ADAPTER, LoraSettings
from handler.request import DecodeRow, SlotRequest, SlotRequestError
from tests.support.lora import make_lora_adapter
from tests.support.neuron import Driver, calls, greedy, hf_greedy, nxdi_yaml

pytestmark = pytest.mark.usefixtures("fake_neuronx", "one_torch_thread")

PROMPT = "Once upon a time there was"
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def made_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three adapters on the tiny model (strong enough to change its greedy tokens): a and b on q/v,
    c on every projection; made once, copied per test (tests change them)."""
    root = tmp_path_factory.mktemp("nxdi-lora")
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    return {
        "a": make_lora_adapter(tiny_model_dir, root / "a", 1, scale=4.0),
        "b": make_lora_adapter(tiny_model_dir, root / "b", 2, scale=4.0),
        "c": make_lora_adapter(tiny_model_dir, root / "c", 3, rank=4, target_modules=targets, scale=2.0),
        "a2": make_lora_adapter(tiny_model_dir, root / "a2", 11, scale=4.0),  # a's replacement on disk
    }


@pytest.fixture
def adapters(made_adapters: dict[str, Path], tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, path in made_adapters.items():
        out[name] = tmp_path / "adapters" / name
        shutil.copytree(path, out[name])
    return out


@pytest.fixture
def start_lora(checkpoint: Path) -> Iterator[Callable[..., Any]]:
    """start_lora(adapters: name -> folder, n_slots=3, max_loras=2, **nxdi) -> a warmed NxdiBackend."""
    from handler.backends.nxdi import NxdiBackend

    started: list[Any] = []

    def start(adapters: dict[str, Path], n_slots: int = 3, max_loras: int = 2, rank: int = 8, **nxdi: Any) -> Any:
        config = ServingConfig.from_model_yaml(
            nxdi_yaml(checkpoint, n_slots=n_slots, nxdi={"context_buckets": [16, 64], **nxdi})
        )
        lora = LoraSettings.of(adapters, max_loras=max_loras, max_lora_rank=rank)
        backend = NxdiBackend(config, checkpoint, None, 1, lora=lora)
        started.append(backend)
        backend.warmup()
        return backend

    yield start
    for backend in started:
        backend.close()


def peft_greedy(checkpoint: Path, adapter: Path, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The reference: PEFT's model with the adapter, greedy over the whole sequence each step."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from handler.backends.hf import DTYPE_KWARG

    base = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, **{DTYPE_KWARG: torch.float32})
    model = PeftModel.from_pretrained(base, str(adapter)).eval()
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]


def forwards(call_log: Path) -> list[dict[str, Any]]:
    return calls(call_log, "forward")


def run(backend: Any, requests: list[SlotRequest], steps: int) -> dict[int, list[int]]:
    """The requests prefilled together, then `steps` decodes of every slot by the plan's rows."""
    driver = Driver(backend)
    driver.join(*requests)
    adapters = {request.slot: request.adapter_id for request in requests}
    for _ in range(steps):
        slots = sorted(driver.tokens)
        rows = [DecodeRow(slot, adapter_id=adapters[slot]) for slot in slots]
        for slot, choices in zip(slots, backend.decode_plan(rows), strict=True):
            driver.tokens[slot].extend(choice.token_id for choice in choices)
    return {slot: driver.leave(slot) for slot in sorted(driver.tokens)}


def test_compiles_with_lora_serving_config_and_indexes_every_row_of_every_call(
    adapters, start_lora, checkpoint, fake_neuronx
):
    backend = start_lora({"a": adapters["a"], "b": adapters["b"]})
    config = json.loads((backend.cache.artifacts_dir / "neuron_config.json").read_text())["neuron_config"]
    lora = config["lora_config"]
    assert list(lora["lora_ckpt_paths"]) == [BASE_ADAPTER, "a", "b"]  # index 0 the base, then in order
    assert lora["max_loras"] == 3 and lora["batch_size"] == 3 and lora["max_lora_rank"] == 8
    assert sorted(lora["target_modules"]) == ["q_proj", "v_proj"] and lora["dynamic_multi_lora"] is False
    assert backend.lora_shapes()["k_proj"] == (64, 32)  # the tiny Llama: 4 heads, 2 KV heads of 16

    warm = forwards(fake_neuronx)  # the backend's warm-up: every slot prefilled with the base, one decode
    assert warm and all(f["adapter_ids"] == [0] * f["rows"] for f in warm)
    before = len(warm)
    prompt = tuple(backend.encode(PROMPT))
    run(backend, [greedy(0, prompt, adapter_id="b"), greedy(1, prompt), greedy(2, prompt, adapter_id="a")], 3)
    served = forwards(fake_neuronx)[before:]
    contexts = [f for f in served if f["kind"] == "context"]
    decodes = [f for f in served if f["kind"] == "decode"]
    assert [(f["seq_ids"], f["adapter_ids"]) for f in contexts] == [([0], [2]), ([1], [0]), ([2], [1])]
    assert len(decodes) == 3 and all(f["adapter_ids"] == [2, 0, 1] and f["seq_ids"] == [0, 1, 2] for f in decodes)
    # what the device ran each row with: [active row, the index of the adapter copied into it]
    assert all(f["programs"][0]["lora"] == [[0, 2], [1, 0], [2, 1]] for f in decodes)


def test_each_row_gets_its_adapters_tokens_whoever_its_batch_mates(adapters, start_lora, checkpoint):
    backend = start_lora({"a": adapters["a"], "b": adapters["b"]})
    prompt = tuple(backend.encode(PROMPT))
    expected = {
        None: hf_greedy(checkpoint, prompt, NEW_TOKENS),
        "a": peft_greedy(checkpoint, adapters["a"], prompt, NEW_TOKENS),
        "b": peft_greedy(checkpoint, adapters["b"], prompt, NEW_TOKENS),
    }
    assert len({tuple(tokens) for tokens in expected.values()}) == 3, "the adapters must change the output"
    alone = {name: run(backend, [greedy(1, prompt, adapter_id=name)], NEW_TOKENS - 1)[1] for name in expected}
    assert alone == expected
    mixed = run(
        backend,
        [greedy(0, prompt, adapter_id="a"), greedy(1, prompt), greedy(2, prompt, adapter_id="b")],
        NEW_TOKENS - 1,
    )
    assert mixed == {0: expected["a"], 1: expected[None], 2: expected["b"]}


def test_a_slot_keeps_its_adapter_when_others_come_and_go(adapters, start_lora, checkpoint):
    backend = start_lora({"a": adapters["a"], "c": adapters["c"]}, n_slots=2)
    prompt = tuple(backend.encode(PROMPT))
    driver = Driver(backend)
    driver.join(greedy(0, prompt, adapter_id="c"))
    driver.step()
    driver.join(greedy(1, prompt, adapter_id="a"))  # prefilled beside a decoding slot
    for _ in range(NEW_TOKENS - 2):
        driver.step()
    later = driver.leave(1)
    driver.step()
    assert driver.leave(0)[:NEW_TOKENS] == peft_greedy(checkpoint, adapters["c"], prompt, NEW_TOKENS)
    assert later[: NEW_TOKENS - 1] == peft_greedy(checkpoint, adapters["a"], prompt, NEW_TOKENS - 1)


def test_an_adapter_changed_on_disk_recompiles_and_its_new_weights_are_served(
    adapters, start_lora, checkpoint, fake_neuronx
):
    first = start_lora({"a": adapters["a"]}, n_slots=2)
    prompt = tuple(first.encode(PROMPT))
    old = peft_greedy(checkpoint, adapters["a"], prompt, 4)
    assert run(first, [greedy(0, prompt, adapter_id="a")], 3)[0] == old
    first.close()
    again = start_lora({"a": adapters["a"]}, n_slots=2)
    assert again.path_taken == "load"  # unchanged: loads, with this start's base adapter folder
    again.close()

    shutil.copyfile(adapters["a2"] / "adapter_model.safetensors", adapters["a"] / "adapter_model.safetensors")
    changed = start_lora({"a": adapters["a"]}, n_slots=2)
    assert changed.path_taken == "compile" and len(calls(fake_neuronx, "compile")) == 2
    new = peft_greedy(checkpoint, adapters["a2"], prompt, 4)
    assert new != old, "the replacement must change the output"
    assert run(changed, [greedy(0, prompt, adapter_id="a")], 3)[0] == new


def test_a_changed_adapter_is_refused_without_compile_on_start_never_served_stale(adapters, start_lora):
    start_lora({"a": adapters["a"]}, n_slots=2).close()
    shutil.copyfile(adapters["a2"] / "adapter_model.safetensors", adapters["a"] / "adapter_model.safetensors")
    stale = r"manifest mismatch \(lora\.adapters\.a\.adapter_model\.safetensors\.sha256: '[0-9a-f]+' -> "
    with pytest.raises(ConfigError, match=stale):
        start_lora({"a": adapters["a"]}, n_slots=2, compile_on_start=False)


@pytest.mark.compile_in_child  # the recipe, LoRA keywords included, goes to the compile child as JSON
def test_a_moved_adapter_with_the_same_content_loads_without_a_compile(adapters, start_lora, tmp_path, fake_neuronx):
    first = start_lora({"a": adapters["a"]}, n_slots=2)
    assert calls(fake_neuronx, "compile")[0]["pid"] != calls(fake_neuronx, "load")[0]["pid"]
    first.close()
    moved = tmp_path / "elsewhere" / "a"
    shutil.move(adapters["a"], moved)
    backend = start_lora({"a": moved}, n_slots=2, compile_on_start=False)
    assert backend.path_taken == "load" and len(calls(fake_neuronx, "compile")) == 1


def test_unknown_and_mismatched_adapters_fail_their_row_alone(adapters, start_lora, checkpoint):
    backend = start_lora({"a": adapters["a"]}, n_slots=2)
    prompt = tuple(backend.encode(PROMPT))
    with pytest.raises(SlotRequestError, match="serves no LoRA adapter 'zz'") as refused:
        backend.prefill([greedy(0, prompt), greedy(1, prompt, adapter_id="zz")])
    assert refused.value.slot == 1 and refused.value.param == "model"
    backend.prefill([greedy(0, prompt, adapter_id="a")])
    with pytest.raises(SlotRequestError, match="prefilled with 'a'") as mismatch:
        backend.decode_plan([DecodeRow(0, adapter_id=None)])
    assert mismatch.value.slot == 0


def test_runtime_updates_are_refused_as_nxdi_0_8_allows(adapters, start_lora):
    backend = start_lora({"a": adapters["a"]}, n_slots=2)
    shapes = backend.lora_shapes()
    backend.load_adapter(read_adapter("a", adapters["a"], 8, shapes))  # the one it started with: a no-op
    with pytest.raises(NotImplementedError, match="cannot load LoRA adapter 'b' at run time"):
        backend.load_adapter(read_adapter("b", adapters["b"], 8, shapes))
    with pytest.raises(NotImplementedError, match="set dynamic_multi_lora: true"):
        backend.unload_adapter("a")
    # What the run-time routes answer before they touch the engine (handler/core/adapter_updates.py).
    assert "LoraModelManager.add_adapter does nothing" in backend.runtime_adapter_refusal(unload=False)
    assert "only with handler.nxdi.dynamic_multi_lora" in backend.runtime_adapter_refusal(unload=True)


def test_dynamic_multi_lora_swaps_adapters_through_one_device_slot(adapters, start_lora, checkpoint, fake_neuronx):
    three = {"a": adapters["a"], "b": adapters["b"], "c": adapters["c"]}
    backend = start_lora(three, n_slots=2, max_loras=1, dynamic_multi_lora=True, save_sharded_checkpoint=False)
    lora = json.loads((backend.cache.artifacts_dir / "neuron_config.json").read_text())["neuron_config"]["lora_config"]
    assert list(lora["lora_ckpt_paths"]) == [BASE_ADAPTER, "a"] and lora["max_loras"] == 2
    assert list(lora["lora_ckpt_paths_cpu"]) == [BASE_ADAPTER, "a", "b", "c"] and lora["max_cpu_loras"] == 4
    prompt = tuple(backend.encode(PROMPT))
    for index, name in ((2, "b"), (3, "c"), (1, "a"), (2, "b")):
        before = len(forwards(fake_neuronx))
        assert run(backend, [greedy(0, prompt, adapter_id=name)], 2)[0] == peft_greedy(
            checkpoint, three[name], prompt, 3
        )
        context, *decodes = forwards(fake_neuronx)[before:]
        assert context["adapter_ids"] == [index]  # the backend's index; NxDI swapped it into a device slot:
        assert context["adapter_positions"] == [1]  # the base, used at warm-up, stays (LRU), the other goes
        assert all(f["programs"][0]["lora"][0] == [0, index] for f in decodes)  # slot 0 ran with it

    assert backend.runtime_adapter_refusal(unload=True) is None
    backend.unload_adapter("c")
    with pytest.raises(SlotRequestError, match="serves no LoRA adapter 'c'"):
        backend.prefill([greedy(0, prompt, adapter_id="c")])
    assert 3 not in backend.model.lora_model_manager.cpu_adapter_cache.get_adapter_ids()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root, tiny: make_lora_adapter(tiny, root / "r1", 5, rank=1), r"rank 1: NxD Inference cannot load"),
        (lambda root, tiny: make_lora_adapter(tiny, root / "r16", 5, rank=16), r"rank 16 is above"),
    ],
)
def test_adapters_nxdi_cannot_serve_are_refused_at_start_naming_them(
    make, message, start_lora, tmp_path, tiny_model_dir, fake_neuronx
):
    adapter = make(tmp_path, tiny_model_dir)
    with pytest.raises(ConfigError, match=rf"handler\.lora\.adapters: LoRA adapter '\w+'.*{message}"):
        start_lora({"x": adapter}, n_slots=2)
    assert not calls(fake_neuronx, "compile")


def test_dynamic_multi_lora_with_presharded_weights_is_refused_at_config_time(checkpoint):
    yaml = nxdi_yaml(checkpoint, nxdi={"dynamic_multi_lora": True})
    with pytest.raises(ConfigError, match="dynamic_multi_lora needs save_sharded_checkpoint: false"):
        ServingConfig.from_model_yaml(yaml)


def test_a_row_naming_an_adapter_fails_on_a_model_started_without_them(checkpoint, start_backend):
    backend = start_backend(nxdi_yaml(checkpoint, n_slots=2))
    assert backend.lora_shapes() is None
    with pytest.raises(SlotRequestError, match="started without LoRA adapters") as refused:
        backend.prefill([greedy(1, backend.encode(PROMPT), adapter_id="a")])
    assert refused.value.slot == 1
