from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.asgi_frontend import ASGI, AsgiFrontend, start_asgi_frontend
from tests.support.sagemaker_container import CONTAINER_MODEL_CONFIG, SAGEMAKER_MODEL_NAME, start_container
from tests.support.torchserve_process import TorchServe, build_archive


@pytest.fixture(scope="package", params=("torchserve", ASGI))
def container(
    request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TorchServe | AsgiFrontend]:
    """torchserve configured as in the SageMaker container: the toolkit's file, overridden by the
    archive's sagemaker.properties through TS_CONFIG_FILE (scripts/sagemaker/deploy.py); or the ASGI
    frontend in SageMaker mode (/ping and /invocations without a key)."""
    if request.param == ASGI:
        frontend = start_asgi_frontend(
            tmp_path_factory.mktemp("asgi-sagemaker"),
            tiny_model_dir,
            CONTAINER_MODEL_CONFIG,
            model_name=SAGEMAKER_MODEL_NAME,
            sagemaker=True,
        )
        try:
            yield frontend
        finally:
            frontend.stop()
        return
    workdir = tmp_path_factory.mktemp("torchserve-sagemaker")
    store = build_archive(workdir, tiny_model_dir, CONTAINER_MODEL_CONFIG, SAGEMAKER_MODEL_NAME)
    ts = start_container(workdir, store / SAGEMAKER_MODEL_NAME)
    try:
        yield ts
    finally:
        ts.stop()
