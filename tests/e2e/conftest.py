from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.failpoints import ENV_VAR as FAILPOINT_ENV
from tests.support.asgi_frontend import ASGI, AsgiFrontend, running_asgi_frontend
from tests.support.modes import MODES, with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

FAILPOINT_MARKER = "<<fail-inside-generate>>"
E2E = Path(__file__).resolve().parent

E2E_MODEL_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 4,
    "maxBatchDelay": 200,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "backend": "hf",
        "n_positions": 1024,
        "default_max_new_tokens": 32,
        "max_new_tokens": 600,
    },
    "micro_batching": {"micro_batch_size": 4, "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2}},
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The ASGI frontend's parameter (tests/support/asgi_frontend.py) runs only in the route tests
    marked `both_frontends` (a module's pytestmark or a test's), and not where a test is marked
    `torchserve_only` (it reads TorchServe's own logs, ports or archive), nor under
    `--frontends torchserve`. `--modes continuous` leaves out the e2e tests' static-mode runs."""
    asgi_too = config.getoption("frontends") == "both"
    static_too = config.getoption("modes") == "both"
    keep, drop = [], []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        named = {value for value in params.values() if isinstance(value, str)}  # the servers' and modes' names
        on_asgi = ASGI in named
        wanted = (
            asgi_too and item.get_closest_marker("both_frontends") and not item.get_closest_marker("torchserve_only")
        )
        static_run = "static" in named and E2E in item.path.parents
        (drop if (on_asgi and not wanted) or (static_run and not static_too) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="package", params=(*MODES, ASGI))
def server(
    request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe | AsgiFrontend]:
    """One torchserve per scheduling mode, and the ASGI frontend, for the e2e tests of this package;
    stopped even if a test fails."""
    if request.param == ASGI:
        yield request.getfixturevalue("asgi_server")
        return
    workdir = tmp_path_factory.mktemp(f"torchserve-{request.param}")
    config = with_mode(E2E_MODEL_CONFIG, request.param)
    ts = start_torchserve(workdir, tiny_model_dir, config, env={FAILPOINT_ENV: FAILPOINT_MARKER})
    ts.mode = request.param
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="package")
def asgi_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AsgiFrontend]:
    """One ASGI frontend (continuous, 4 slots) for the e2e tests of this package: the `server`
    fixture's ASGI parameter and `probed_server`'s."""
    with running_asgi_frontend(
        tmp_path_factory.mktemp("asgi"), tiny_model_dir, E2E_MODEL_CONFIG, env={FAILPOINT_ENV: FAILPOINT_MARKER}
    ) as frontend:
        yield frontend


@pytest.fixture(scope="package")
def continuous_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    """One continuous-mode torchserve (4 slots) shared by the modules that probe one server from
    outside (isolation, fuzz, gRPC, HTTP edges): each leaves it serving, with its slots free."""
    ts = start_torchserve(
        tmp_path_factory.mktemp("torchserve-continuous"), tiny_model_dir, with_mode(E2E_MODEL_CONFIG, "continuous")
    )
    try:
        yield ts
    finally:
        ts.stop()


@pytest.fixture(scope="package", params=("torchserve", ASGI))
def probed_server(request: pytest.FixtureRequest) -> TorchServe | AsgiFrontend:
    """The continuous torchserve and the ASGI frontend, each shared by the modules marked
    `both_frontends` that probe one server from outside (isolation, fuzz, HTTP edges)."""
    return request.getfixturevalue("continuous_server" if request.param == "torchserve" else "asgi_server")
