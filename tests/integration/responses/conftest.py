"""The Responses API (issue 44) on the hf backend and the tiny model, through both frontends: the
ASGI app in-process (the official `openai` client over its transport) and the real handler under
the TorchServe harness (bodies and events as TorchServe would send them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from handler.frontend.model import ServedModel
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.asgi_inprocess import BASE_URL, InProcessFrontend, running_in_process
from tests.support.torchserve_harness import ContinuousFrontend, make_context

N_SLOTS = 4


def responses_config(model_dir: Path, store_mb: int = 16) -> dict[str, Any]:
    return {
        "continuousBatching": True,
        "batchSize": 2 * N_SLOTS,
        "maxBatchDelay": 1,
        "jobQueueSize": 16,
        "handler": {
            "model_checkpoint_dir": str(model_dir),
            "backend": "hf",
            "n_positions": 512,
            "default_max_new_tokens": 16,
            "max_new_tokens": 64,
            "responses": {"store_mb": store_mb},
        },
        "scheduler": {"mode": "continuous", "n_slots": N_SLOTS},
    }


@pytest.fixture(scope="package")
def asgi(tiny_model_dir: Path) -> Iterator[InProcessFrontend]:
    with running_in_process(ServedModel(responses_config(tiny_model_dir), tiny_model_dir)) as served:
        yield served


@pytest.fixture(scope="package")
def client(asgi: InProcessFrontend) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{BASE_URL}/v1", api_key=asgi.key, http_client=asgi.client, max_retries=0)


@pytest.fixture(scope="package")
def torchserve(tiny_model_dir: Path) -> Iterator[ContinuousFrontend]:
    handler = Inf2StreamingHandler()
    context = make_context(responses_config(tiny_model_dir), str(tiny_model_dir))
    handler.initialize(context)
    yield ContinuousFrontend(handler, context, batch_size=2 * N_SLOTS)
    handler.shutdown()
