"""The real default model (SmolLM2-135M-Instruct, converted by `make model` into
models/smollm2-135m-instruct) served by a real torchserve, and the same checkpoint in-process
for the answers the served ones are checked against."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.modes import with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[2]
REAL_MODEL_DIR = REPO / "models" / "smollm2-135m-instruct"

# The shipped model-config.yaml's settings, continuous batching with 4 slots.
REAL_MODEL_CONFIG: dict[str, Any] = with_mode(
    {
        "minWorkers": 1,
        "maxWorkers": 1,
        "responseTimeout": 120,
        "jobQueueSize": 32,
        "handler": {
            "model_checkpoint_dir": "model",
            "backend": "hf",
            "amp": "f32",
            "n_positions": 2048,
            "default_max_new_tokens": 64,
            "max_new_tokens": 512,
        },
    },
    "continuous",
    n_slots=4,
)


@pytest.fixture(scope="session")
def real_model_dir() -> Path:
    """The converted checkpoint; `make test` runs `make model` first. Missing is a failure that
    says how to get it, never a skip."""
    if not (REAL_MODEL_DIR / "model.safetensors").is_file():
        pytest.fail(f"{REAL_MODEL_DIR} is missing: run `make model` (make test does)")
    return REAL_MODEL_DIR


@pytest.fixture(scope="package")
def real_server(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    """One torchserve with the real model for the tests of tests/real_model."""
    ts = start_torchserve(tmp_path_factory.mktemp("torchserve-real-model"), real_model_dir, REAL_MODEL_CONFIG)
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="package")
def real_client(real_server: TorchServe) -> Any:
    """The official `openai` client pointed at the real server's OpenAI routes (no retries)."""
    import openai

    api_key = real_server.headers.get("Authorization", "Bearer no-token-auth").removeprefix("Bearer ")
    return openai.OpenAI(base_url=f"{real_server.predictions_url}/1.0/v1", api_key=api_key, max_retries=0, timeout=300)


@pytest.fixture(scope="session")
def real_tokenizer(real_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(real_model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def real_model(real_model_dir: Path) -> Any:
    """The same checkpoint in-process (float32, eval): the reference the served answers are checked against."""
    import torch
    from transformers import AutoModelForCausalLM

    from handler.backends.hf import DTYPE_KWARG  # `dtype=` from transformers 4.56, `torch_dtype=` before

    return AutoModelForCausalLM.from_pretrained(
        real_model_dir, local_files_only=True, **{DTYPE_KWARG: torch.float32}
    ).eval()
