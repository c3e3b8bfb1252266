from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sagemaker_container import CONTAINER_MODEL_CONFIG, SAGEMAKER_MODEL_NAME, start_container
from tests.support.torchserve_process import TorchServe, build_archive


@pytest.fixture(scope="package")
def container(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    """torchserve configured as in the SageMaker container: the toolkit's file, overridden by the
    archive's sagemaker.properties through TS_CONFIG_FILE (scripts/sagemaker/deploy.py)."""
    workdir = tmp_path_factory.mktemp("torchserve-sagemaker")
    store = build_archive(workdir, tiny_model_dir, CONTAINER_MODEL_CONFIG, SAGEMAKER_MODEL_NAME)
    ts = start_container(workdir, store / SAGEMAKER_MODEL_NAME)
    try:
        yield ts
    finally:
        ts.stop()
