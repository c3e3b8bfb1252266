from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.sagemaker_common import container_environment
from tests.torchserve_process import TorchServe, start_torchserve

# What the SageMaker toolkit does in the DLC: the model is registered as "model".
SAGEMAKER_MODEL_NAME = "model"
CONTAINER_MODEL_CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 2,
    "maxBatchDelay": 20,
    "responseTimeout": 55,
    "handler": {
        "model_checkpoint_dir": "model",
        "n_positions": 256,
        "default_max_new_tokens": 16,
        "max_new_tokens": 128,
    },
    "micro_batching": {"micro_batch_size": 2, "parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1}},
}
# What the DLC's SageMaker toolkit puts in the config.properties it writes, except that
# token auth is left at TorchServe's default (on): the TS_* environment from
# serving/sagemaker.properties (scripts/sagemaker_deploy.py) must turn it off, and must turn
# the toolkit's model API back off. The harness adds free 127.0.0.1 ports and the model store.
TOOLKIT_PROPERTIES = {"enable_envvars_config": "true", "enable_model_api": "true"}


@pytest.fixture(scope="package")
def container(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    """torchserve configured as in the SageMaker container: toolkit file + our TS_* environment."""
    env = container_environment()
    env["TS_INSTALL_PY_DEP_PER_MODEL"] = "false"  # no pip inside tests (the archive has no -r here)
    workdir = tmp_path_factory.mktemp("torchserve-sagemaker")
    # With token auth off torchserve writes no key_file.json; the harness's readiness probe
    # waits for one and sends its key, which torchserve then ignores.
    (workdir / "key_file.json").write_text('{"inference": {"key": "unused-auth-is-off"}}')
    ts = start_torchserve(
        workdir,
        tiny_model_dir,
        CONTAINER_MODEL_CONFIG,
        env=env,
        model_name=SAGEMAKER_MODEL_NAME,
        extra_properties=TOOLKIT_PROPERTIES,
    )
    try:
        yield ts
    finally:
        ts.stop()
