from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from handler.inf2_handler import Inf2StreamingHandler
from tests.support.asgi_frontend import ASGI, AsgiFrontend, running_asgi_frontend
from tests.support.torchserve_harness import Reply, make_context, run_batch
from tests.support.torchserve_process import TorchServe, start_torchserve

HANDLER_YAML = {
    "batchSize": 4,
    "handler": {"n_positions": 256, "default_max_new_tokens": 16, "max_new_tokens": 100},
    "scheduler": {"mode": "static", "n_slots": 4},
    "micro_batching": {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1}},
}


@pytest.fixture(scope="package")
def served(tiny_model_dir: Path) -> Iterator[tuple[Inf2StreamingHandler, Any]]:
    """The real handler with the tiny model, driven like TorchServe's worker (no Java)."""
    config = {**HANDLER_YAML, "handler": {**HANDLER_YAML["handler"], "model_checkpoint_dir": str(tiny_model_dir)}}
    handler = Inf2StreamingHandler()
    context = make_context(config, str(tiny_model_dir))
    handler.initialize(context)
    try:
        yield handler, context
    finally:
        handler.shutdown()


@pytest.fixture
def call(served):
    """call(route, body, ...) -> Reply; several (route, body) pairs -> one batch."""

    def run(*pairs: tuple[str, Any]) -> list[Reply]:
        handler, context = served
        rows = [body for _, body in pairs]
        headers = [{"url_path": route} for route, _ in pairs]
        return run_batch(handler, context, rows, headers)

    return run


E2E_MODEL_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "continuousBatching": True,
    "batchSize": 8,
    "maxBatchDelay": 1,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "n_positions": 2048,  # a prompt with tools is ~600 tiny-model tokens (2 characters each)
        "default_max_new_tokens": 32,
        "max_new_tokens": 256,
    },
    "scheduler": {"mode": "continuous", "n_slots": 4},
}


@contextlib.contextmanager
def one_server(
    kind: str, workdir: Path, model_dir: Path, config: dict[str, Any]
) -> Iterator[TorchServe | AsgiFrontend]:
    """A real torchserve (token auth on, continuous mode) or, for `kind` ASGI, the ASGI frontend,
    serving `model_dir` with `config`; always stopped."""
    if kind == ASGI:
        with running_asgi_frontend(workdir, model_dir, config) as frontend:
            yield frontend
        return
    ts = start_torchserve(workdir, model_dir, config)
    ts.mode = "continuous"
    try:
        yield ts
    finally:
        ts.stop()


def openai_url(server: TorchServe | AsgiFrontend) -> str:
    """Where an OpenAI client points: TorchServe passes the rest of the path as url_path."""
    return f"{server.predictions_url}/1.0/v1"


def server_key(server: TorchServe | AsgiFrontend) -> str:
    """TorchServe's inference key (read now: it is renewed on expiry), the ASGI frontend's key; any
    non-empty key where TorchServe has no token auth (0.11)."""
    return server.headers.get("Authorization", "Bearer no-token-auth").removeprefix("Bearer ")


@pytest.fixture(scope="package", params=("torchserve", ASGI))
def server(
    request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe | AsgiFrontend]:
    """A real torchserve (token auth on), or the ASGI frontend for the modules marked both_frontends
    (tests/e2e/conftest.py), for the external-client tests; always stopped."""
    with one_server(request.param, tmp_path_factory.mktemp("openai"), tiny_model_dir, E2E_MODEL_CONFIG) as served:
        yield served


@pytest.fixture(scope="package")
def openai_base_url(server: TorchServe | AsgiFrontend) -> str:
    return openai_url(server)


@pytest.fixture(scope="package")
def api_key(server: TorchServe | AsgiFrontend) -> str:
    return server_key(server)
