"""LoRA adapters on the hf backend with the default model (issue 43), in-process: adapters made by the
tests with peft (tests/support/lora.py); the served greedy output with an adapter is peft's own
`generate` with it, base rows are the base model's, and one decode forward mixing base rows and rows of
two adapters gives each row what it gets alone. tests/integration/test_hf_lora.py covers the rest on
the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handler.backends.hf import DTYPE_KWARG, HFBackend
from handler.config import HandlerConfig
from handler.lora.adapters import read_adapter
from handler.request import DecodeRow, SlotRequest
from tests.support.lora import greedy_generate, make_lora_adapter

N_TOKENS = 10
ROWS = (  # slot, prompt, adapter
    (0, "The capital of France is", None),
    (1, "The capital of France is", "a"),
    (2, "The capital of France is", "b"),
)


@pytest.fixture(scope="module")
def adapters(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smollm2-lora")
    return {name: make_lora_adapter(real_model_dir, root / name, seed) for name, seed in (("a", 1), ("b", 2))}


def test_adapters_on_the_default_model_are_peft_s_and_mix_in_one_step(real_model_dir, adapters):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    config = HandlerConfig(model_checkpoint_dir=str(real_model_dir), amp="f32")
    backend = HFBackend(config, real_model_dir, len(ROWS))
    for name, path in adapters.items():
        backend.load_adapter(read_adapter(name, path, 64, backend.lora_shapes()))
    prompts = {slot: backend.encode(text) for slot, text, _ in ROWS}

    # The reference: transformers' generate on the base model, then peft's with each adapter.
    model = AutoModelForCausalLM.from_pretrained(real_model_dir, local_files_only=True, **{DTYPE_KWARG: torch.float32})
    expected = {slot: greedy_generate(model.eval(), prompts[slot], N_TOKENS) for slot, _, name in ROWS if name is None}
    peft_model = PeftModel.from_pretrained(model, str(adapters["a"]), adapter_name="a").eval()
    peft_model.load_adapter(str(adapters["b"]), adapter_name="b")
    for slot, _, name in ROWS:
        if name is not None:
            peft_model.set_adapter(name)
            expected[slot] = greedy_generate(peft_model, prompts[slot], N_TOKENS)
    assert expected[0] != expected[1] != expected[2] != expected[0]  # the adapters change the output

    # The three rows at once: every decode step is one forward over a base row, an a row and a b row.
    choices = backend.prefill([SlotRequest(slot, tuple(prompts[slot]), adapter_id=name) for slot, _, name in ROWS])
    served = {slot: [choice.token_id] for (slot, _, _), choice in zip(ROWS, choices, strict=True)}
    plan = [DecodeRow(slot=slot, adapter_id=name) for slot, _, name in ROWS]
    for _ in range(N_TOKENS - 1):
        for row, tokens in zip(plan, backend.decode_plan(plan), strict=True):
            served[row.slot] += [choice.token_id for choice in tokens]
    assert served == expected
