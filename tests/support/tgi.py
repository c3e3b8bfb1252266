from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import huggingface_hub.constants
import pytest
from huggingface_hub import InferenceClient

from handler.failpoints import ENV_VAR as FAILPOINT_ENV
from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.asgi_frontend import ASGI, AsgiFrontend, running_asgi_frontend
from tests.support.modes import MODES, with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

# TorchServe 0.12 passes the path after /predictions/<model>/<version>/ as url_path; 0.11 passes
# none, so there every TGI request is recognised by its body (handler.no_route_api: tgi).
HAS_URL_PATH = has_secure_defaults()
FAILPOINT_MARKER = "<<fail-inside-generate>>"  # a prompt holding it fails at a decode step

TGI_MODEL_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 4,
    "maxBatchDelay": 50,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "hf",
        "n_positions": 512,
        "default_max_new_tokens": 16,
        "max_new_tokens": 400,
        "no_route_api": "tgi",
    },
    "micro_batching": {"micro_batch_size": 4, "parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1}},
}


@pytest.fixture(scope="package", params=(*MODES, ASGI))
def server(
    request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe | AsgiFrontend]:
    """A real torchserve (token auth on where TorchServe has it) per scheduling mode, TGI for unrouted
    bodies; and the ASGI frontend for the modules marked both_frontends (tests/e2e/conftest.py)."""
    if request.param == ASGI:
        with running_asgi_frontend(
            tmp_path_factory.mktemp("asgi-tgi"), tiny_model_dir, TGI_MODEL_CONFIG, env={FAILPOINT_ENV: FAILPOINT_MARKER}
        ) as frontend:
            yield frontend
        return
    ts = start_torchserve(
        tmp_path_factory.mktemp(f"torchserve-tgi-{request.param}"),
        tiny_model_dir,
        with_mode(TGI_MODEL_CONFIG, request.param),
        env={FAILPOINT_ENV: FAILPOINT_MARKER},
    )
    ts.mode = request.param
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="package")
def api_key(server: TorchServe | AsgiFrontend) -> str:
    """TorchServe's inference key; any non-empty key where it has no token auth (0.11)."""
    return server.headers.get("Authorization", "Bearer no-token-auth").removeprefix("Bearer ")


@pytest.fixture(scope="package")
def generate_url(server: TorchServe | AsgiFrontend) -> str:
    return f"{server.predictions_url}/1.0/generate"


@pytest.fixture(autouse=True)
def _hub_online(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/conftest.py sets HF_HUB_OFFLINE=1 (models load from disk); huggingface_hub then
    refuses every request, a local base_url included. The client may talk to our server."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)


@pytest.fixture(scope="module")
def client(generate_url: str, api_key: str) -> InferenceClient:
    """huggingface_hub's client on the server's `generate` route."""
    return InferenceClient(base_url=generate_url, api_key=api_key, timeout=60)
