"""The hf backend on the tiny model with three LoRA adapters made by `peft` (tests/support/lora.py),
served by both frontends: the ASGI app in-process and the real handler under the TorchServe harness.
`max_loras` is 2, so a third adapter requested at once must wait for a place."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.frontend.model import ServedModel
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process
from tests.support.lora import make_lora_adapter
from tests.support.torchserve_harness import make_context

N_SLOTS = 4


@pytest.fixture(scope="package")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora-frontends")
    seeds = {"sql": 1, "chat": 2, "legal": 3}
    return {name: make_lora_adapter(tiny_model_dir, root / name, seed, scale=0.5) for name, seed in seeds.items()}


def lora_config(model_dir: Path, adapters: dict[str, Path]) -> dict[str, Any]:
    return {
        "continuousBatching": True,
        "batchSize": 2 * N_SLOTS,
        "maxBatchDelay": 1,
        "handler": {
            "model_checkpoint_dir": str(model_dir),
            "backend": "hf",
            "n_positions": 256,
            "default_max_new_tokens": 16,
            "max_new_tokens": 64,
            "lora": {"adapters": {name: str(path) for name, path in adapters.items()}, "max_loras": 2},
        },
        "scheduler": {"mode": "continuous", "n_slots": N_SLOTS},
    }


@pytest.fixture(scope="package")
def asgi(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[InProcessFrontend]:
    model = ServedModel(lora_config(tiny_model_dir, adapters), tiny_model_dir)
    with running_in_process(model) as served:
        yield served


@pytest.fixture(scope="package")
def torchserve_handler(tiny_model_dir: Path, adapters: dict[str, Path]) -> Iterator[tuple[Any, Any]]:
    handler = Inf2StreamingHandler()
    context = make_context(lora_config(tiny_model_dir, adapters), str(tiny_model_dir))
    handler.initialize(context)
    yield handler, context
    handler.shutdown()
