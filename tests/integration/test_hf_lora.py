"""LoRA adapters on the hf backend (issue 43), with the tiny model and adapters made by the tests
(tests/support/lora.py): an adapter's output is PEFT's own, base rows stay the base model's, and one
decode forward mixing base rows and rows of two adapters gives each row what it gets alone.
tests/real_model/test_hf_lora.py checks the same on the default model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.lora.adapters import AdapterError, AdapterSpec, read_adapter
from handler.request import DecodeRow, SlotRequest, SlotRequestError, TokenChoice
from tests.support.lora import make_lora_adapter, peft_generate, tiny_lora_adapters

__all__ = ["tiny_lora_adapters"]

N_SLOTS = 4
N_TOKENS = 12
PROMPTS = ("Hello, world", "The quick brown fox", "Once upon a time", "1, 2, 3,")


@pytest.fixture
def backend(tiny_model_dir: Path) -> HFBackend:
    config = HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1)
    return HFBackend(config, tiny_model_dir, N_SLOTS)


def spec(backend: HFBackend, name: str, path: Path) -> AdapterSpec:
    """As the service reads it: checked against the backend's own shapes."""
    return read_adapter(name, path, 64, backend.lora_shapes())


@pytest.fixture
def with_ab(backend: HFBackend, tiny_lora_adapters: dict[str, Path]) -> HFBackend:
    for name, path in tiny_lora_adapters.items():
        backend.load_adapter(spec(backend, name, path))
    return backend


def request(backend: HFBackend, slot: int, text: str, adapter: str | None = None) -> SlotRequest:
    return SlotRequest(slot=slot, prompt_ids=tuple(backend.encode(text)), adapter_id=adapter)


def ids(choices: list[TokenChoice]) -> list[int]:
    return [choice.token_id for choice in choices]


def alone(backend: HFBackend, slot_request: SlotRequest, n: int = N_TOKENS) -> list[int]:
    """The request's first n greedy tokens with the backend to itself."""
    choices = backend.prefill([slot_request])
    while len(choices) < n:
        choices += backend.decode([slot_request.slot])
    backend.release(slot_request.slot)
    return ids(choices)


@pytest.fixture
def forwards(backend: HFBackend) -> Iterator[list[list[str | None]]]:
    """Each model forward's row adapters, in call order."""
    calls: list[list[str | None]] = []
    real = backend.adapters.forward

    def counted(adapters: list[str | None], **kwargs: Any) -> Any:
        calls.append(list(adapters))
        return real(adapters, **kwargs)

    backend.adapters.forward = counted  # type: ignore[method-assign]
    yield calls


# -- the base model's linear layers --------------------------------------------------------------------


def test_lora_shapes_are_the_base_models_linear_layers_without_the_head(backend):
    assert backend.lora_shapes() == {
        "q_proj": (64, 64),
        "k_proj": (64, 32),
        "v_proj": (64, 32),
        "o_proj": (64, 64),
        "gate_proj": (64, 128),
        "up_proj": (64, 128),
        "down_proj": (128, 64),
    }


def test_an_adapter_targeting_the_head_is_refused_by_the_shapes(backend, tiny_model_dir, tmp_path):
    path = make_lora_adapter(tiny_model_dir, tmp_path / "head", 3, target_modules=("q_proj", "lm_head"))
    with pytest.raises(AdapterError, match="'lm_head', which the base model lacks"):
        spec(backend, "head", path)


# -- one adapter -------------------------------------------------------------------------------------


def test_greedy_output_with_an_adapter_is_peft_generates(with_ab, tiny_model_dir, tiny_lora_adapters):
    backend = with_ab
    for name in ("a", "b"):
        prompt = request(backend, 0, PROMPTS[0], name)
        served = alone(backend, prompt)
        assert served == peft_generate(tiny_model_dir, tiny_lora_adapters[name], prompt.prompt_ids, N_TOKENS)
    base = alone(backend, request(backend, 0, PROMPTS[0]))
    assert alone(backend, request(backend, 0, PROMPTS[0], "a")) != base  # the adapter changes the output


def test_base_rows_are_the_base_models_with_adapters_loaded(backend, tiny_lora_adapters, forwards):
    before = [alone(backend, request(backend, 0, text)) for text in PROMPTS]
    assert all(adapters == [None] for adapters in forwards)  # no adapter: the bare model's forward
    for name, path in tiny_lora_adapters.items():
        backend.load_adapter(spec(backend, name, path))
    assert [alone(backend, request(backend, 0, text)) for text in PROMPTS] == before
    # And all four at once, base rows only.
    choices = backend.prefill([request(backend, slot, text) for slot, text in enumerate(PROMPTS)])
    outs = [[choice.token_id] for choice in choices]
    for _ in range(N_TOKENS - 1):
        for out, choice in zip(outs, backend.decode(range(N_SLOTS)), strict=True):
            out.append(choice.token_id)
    assert outs == before


def test_prompt_logprobs_with_an_adapter_are_the_adapters(with_ab):
    backend = with_ab
    texts = {name: PROMPTS[2] for name in (None, "a")}
    got = {}
    for name, text in texts.items():
        slot_request = SlotRequest(
            slot=0, prompt_ids=tuple(backend.encode(text)), adapter_id=name, prompt_logprobs=True
        )
        got[name] = backend.prefill([slot_request])[0].prompt
        backend.release(0)
    assert got[None] is not None and got["a"] is not None and got[None] != got["a"]


# -- mixed batches -----------------------------------------------------------------------------------


def test_one_decode_forward_mixing_base_a_and_b_rows_gives_each_row_its_own_tokens(with_ab, forwards):
    backend = with_ab
    rows = [(0, PROMPTS[0], None), (1, PROMPTS[1], "a"), (2, PROMPTS[2], "b"), (3, PROMPTS[3], "a")]
    expected = {slot: alone(backend, request(backend, slot, text, name)) for slot, text, name in rows}
    forwards.clear()
    choices = backend.prefill([request(backend, slot, text, name) for slot, text, name in rows])
    out = {slot: [choice.token_id] for (slot, _, _), choice in zip(rows, choices, strict=True)}
    plan = [DecodeRow(slot=slot, adapter_id=name) for slot, _, name in rows]
    for _ in range(N_TOKENS - 1):
        for row, tokens in zip(plan, backend.decode_plan(plan), strict=True):
            out[row.slot] += ids(tokens)
    assert out == expected
    assert len(set(map(tuple, out.values()))) == len(rows)  # four different outputs: the adapters matter
    # One forward per prompt (prefill runs each alone), then ONE per decode step with every row's adapter.
    assert forwards == [[None], ["a"], ["b"], ["a"]] + [[None, "a", "b", "a"]] * (N_TOKENS - 1)


def test_rows_join_and_leave_a_mixed_batch(with_ab):
    backend = with_ab
    expected = {
        0: alone(backend, request(backend, 0, PROMPTS[0], "b")),
        1: alone(backend, request(backend, 1, PROMPTS[1])),
        2: alone(backend, request(backend, 2, PROMPTS[2], "a")),
    }
    out = {0: ids(backend.prefill([request(backend, 0, PROMPTS[0], "b")]))}
    out[0] += ids(backend.decode([0]))
    out[1] = ids(backend.prefill([request(backend, 1, PROMPTS[1])]))
    for _ in range(3):
        for slot, choice in zip((0, 1), backend.decode([0, 1]), strict=True):
            out[slot].append(choice.token_id)
    out[2] = ids(backend.prefill([request(backend, 2, PROMPTS[2], "a")]))
    live = [0, 1, 2]
    while live:
        for slot, choice in zip(live, backend.decode(live), strict=True):
            out[slot].append(choice.token_id)
        for slot in [slot for slot in live if len(out[slot]) == N_TOKENS]:
            backend.release(slot)
            live.remove(slot)
    assert out == expected


# -- refusals -----------------------------------------------------------------------------------------


def test_a_row_naming_an_unknown_adapter_fails_alone_naming_model(with_ab):
    backend = with_ab
    good, bad = request(backend, 0, PROMPTS[0], "a"), request(backend, 1, PROMPTS[1], "nope")
    with pytest.raises(SlotRequestError, match="'nope' is not loaded") as raised:
        backend.prefill([good, bad])
    assert raised.value.slot == 1 and raised.value.param == "model"
    # Nothing ran: the engine runs the call again without the failed row.
    assert ids(backend.prefill([good]))
    # A decode row naming another adapter than its slot's fails alone too.
    with pytest.raises(SlotRequestError) as raised:
        backend.decode_plan([DecodeRow(slot=0, adapter_id="b")])
    assert raised.value.slot == 0 and raised.value.param == "model"
    assert len(backend.decode_plan([DecodeRow(slot=0, adapter_id="a")])[0]) == 1


def test_loading_a_name_twice_is_refused(with_ab, tiny_lora_adapters):
    with pytest.raises(AdapterError, match="'a' is already loaded"):
        with_ab.load_adapter(spec(with_ab, "a", tiny_lora_adapters["b"]))


def test_any_served_name_works_dots_included(backend, tiny_lora_adapters):
    expected = alone(backend, request(backend, 0, PROMPTS[1], None))
    backend.load_adapter(spec(backend, "tenant.v1/__base__", tiny_lora_adapters["a"]))
    with_adapter = alone(backend, request(backend, 0, PROMPTS[1], "tenant.v1/__base__"))
    assert with_adapter != expected
    assert alone(backend, request(backend, 0, PROMPTS[1], None)) == expected


# -- unloading ----------------------------------------------------------------------------------------


def test_unload_forgets_the_adapter_and_the_last_one_leaves_the_bare_base_model(with_ab, tiny_lora_adapters):
    backend = with_ab
    base = alone(backend, request(backend, 0, PROMPTS[0]))
    with_b = alone(backend, request(backend, 0, PROMPTS[0], "b"))
    backend.prefill([request(backend, 2, PROMPTS[2], "a")])
    with pytest.raises(ValueError, match=r"'a' is in use by slots \[2\]"):
        backend.unload_adapter("a")
    backend.release(2)
    backend.unload_adapter("a")
    with pytest.raises(SlotRequestError, match="'a' is not loaded") as raised:
        backend.prefill([request(backend, 0, PROMPTS[0], "a")])
    assert raised.value.param == "model"
    assert alone(backend, request(backend, 0, PROMPTS[0], "b")) == with_b
    with pytest.raises(ValueError, match="'a' is not loaded"):
        backend.unload_adapter("a")
    backend.unload_adapter("b")
    assert not [name for name, _ in backend.model.named_modules() if "lora" in name]  # no LoRA layer left
    assert alone(backend, request(backend, 0, PROMPTS[0])) == base
    # After the last one went, loading wraps the model afresh.
    backend.load_adapter(spec(backend, "b", tiny_lora_adapters["b"]))
    assert alone(backend, request(backend, 0, PROMPTS[0], "b")) == with_b
    assert alone(backend, request(backend, 0, PROMPTS[0])) == base


@pytest.mark.parametrize("first", [True, False], ids=["first adapter", "beside another"])
def test_an_adapter_peft_cannot_load_leaves_nothing_behind(backend, tiny_lora_adapters, tmp_path, first):
    base = alone(backend, request(backend, 0, PROMPTS[0]))
    if not first:
        backend.load_adapter(spec(backend, "a", tiny_lora_adapters["a"]))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_bytes((tiny_lora_adapters["b"] / "adapter_config.json").read_bytes())
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    checked = spec(backend, "b", tiny_lora_adapters["b"])
    with pytest.raises(AdapterError, match="'b': peft could not load it"):
        backend.load_adapter(AdapterSpec("b", broken, checked.rank, checked.alpha, checked.target_modules, ""))
    assert "b" not in backend.adapters
    # PEFT holds no adapter but the loaded ones (none at all when the broken one came first).
    held = {key for module in backend.model.modules() for key in getattr(module, "lora_A", {})}
    assert len(held) == (0 if first else 1)
    if first:
        assert not [name for name, _ in backend.model.named_modules() if "lora" in name]
    assert alone(backend, request(backend, 0, PROMPTS[0])) == base
    backend.load_adapter(checked)  # the name is free: the real one loads
    assert alone(backend, request(backend, 0, PROMPTS[0], "b")) != base
