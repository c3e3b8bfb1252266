"""LoRA adapters made by the tests, with `peft`, for a base model folder (issue 43).

`make_lora_adapter` writes a PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) whose
weights, lora_B included, come from a fixed seed: non-zero, so the adapter really changes the model's
output (PEFT initialises lora_B to zeros, an adapter that changes nothing). Two seeds make two different
adapters. `tiny_lora_adapters` is the session's pair on the tiny model ("a" and "b"); a tier's conftest
imports it like the other fixtures of tests/support.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

TARGET_MODULES = ("q_proj", "v_proj")


def make_lora_adapter(
    base_dir: Path,
    out_dir: Path,
    seed: int,
    *,
    rank: int = 8,
    alpha: int = 16,
    target_modules: Sequence[str] = TARGET_MODULES,
    scale: float = 0.2,
) -> Path:
    """A LoRA adapter for the model in `base_dir`, saved in `out_dir` (safetensors): lora_A and lora_B
    drawn from a generator seeded with `seed`: lora_A with the usual 1/sqrt(in_features) spread, lora_B such
    that the change (alpha/rank) B A has `scale` times the spread of the module's base weight."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from handler.backends.hf import DTYPE_KWARG

    model = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True, **{DTYPE_KWARG: torch.float32})
    config = LoraConfig(
        r=rank, lora_alpha=alpha, target_modules=list(target_modules), lora_dropout=0.0, task_type="CAUSAL_LM"
    )
    peft_model = get_peft_model(model, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in peft_model.modules():  # registration order: the same draws every time
            lora_a = getattr(module, "lora_A", None)
            if not isinstance(lora_a, torch.nn.ModuleDict) or "default" not in lora_a:
                continue
            a, b = lora_a["default"].weight, module.lora_B["default"].weight
            base_std = float(module.base_layer.weight.std())
            a.copy_(torch.randn(a.shape, generator=generator) / a.shape[1] ** 0.5)
            # (B A)_ij sums `rank` terms of spread std(B) / sqrt(in): solve (alpha / rank) std(B A) = scale std(W).
            b_std = scale * base_std * (rank * a.shape[1]) ** 0.5 / alpha
            b.copy_(torch.randn(b.shape, generator=generator) * b_std)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


@pytest.fixture(scope="session")
def tiny_lora_adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two different adapters on the tiny model: name -> folder. Half the base weights' spread: the tiny
    model's random weights need more than the default to change its greedy tokens on every prompt."""
    root = tmp_path_factory.mktemp("tiny-lora")
    return {
        name: make_lora_adapter(tiny_model_dir, root / name, seed, scale=0.5) for name, seed in (("a", 1), ("b", 2))
    }


def greedy_generate(model: Any, prompt: Sequence[int], n: int) -> list[int]:
    """transformers' own greedy `generate` of exactly `n` tokens (EOS never chosen): a reference."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([list(prompt)]),
            attention_mask=torch.ones((1, len(prompt)), dtype=torch.long),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, len(prompt) :].tolist()


def peft_generate(model_dir: Path, adapter: Path | None, prompt: Sequence[int], n: int) -> list[int]:
    """PEFT's own greedy output with the adapter (None: the base model alone), in-process: the reference."""
    import torch
    from transformers import AutoModelForCausalLM

    from handler.backends.hf import DTYPE_KWARG

    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, **{DTYPE_KWARG: torch.float32})
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return greedy_generate(model.eval(), prompt, n)
