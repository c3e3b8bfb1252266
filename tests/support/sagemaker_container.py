"""The SageMaker container's view of torchserve on this host: started as the DLC's toolkit
starts it, with the environment scripts/sagemaker/deploy.py sets."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from scripts.sagemaker.common import (
    CONTAINER_MODEL_DIR,
    PLUGINS_SUBDIR,
    PROPERTIES_NAME,
    SAGEMAKER_PROPERTIES,
    container_environment,
)
from scripts.serve.build_plugins import build as build_plugins
from tests.support.torchserve_process import TorchServe, free_port

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# What the SageMaker toolkit does in the DLC: the model is registered as "model".
SAGEMAKER_MODEL_NAME = "model"
CONTAINER_MODEL_CONFIG: dict[str, Any] = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "continuousBatching": True,
    "batchSize": 4,
    "maxBatchDelay": 1,
    "responseTimeout": 1200,
    "startupTimeout": 1200,
    "handler": {
        "model_checkpoint_dir": "model",
        "n_positions": 512,
        "default_max_new_tokens": 16,
        "max_new_tokens": 256,
    },
    "scheduler": {"mode": "continuous", "n_slots": 2},
}
# What the DLC's SageMaker toolkit (v2.0.25) puts in the config.properties it writes, with
# token auth left at TorchServe's default (on) and its own addresses: TS_CONFIG_FILE must make
# torchserve read the archive's sagemaker.properties instead, or the model API stays on, every
# call needs a token and nothing answers on the container's ports.
TOOLKIT_PROPERTIES = {
    "vmargs": "-XX:-UseContainerSupport",
    "enable_envvars_config": "true",
    "decode_input_request": "false",
    "load_models": "ALL",
    "enable_model_api": "true",
    "default_response_timeout": "60",
}
READY_TIMEOUT_S = 180


def container_properties(server: TorchServe, model_folder: Path) -> str:
    """serving/sagemaker.properties with the test's free ports in place of 8080-8082 (and gRPC's),
    and plugins_path in the model folder that stands for /opt/ml/model."""
    text = SAGEMAKER_PROPERTIES.read_text()
    in_container = re.escape(f"{CONTAINER_MODEL_DIR}/{PLUGINS_SUBDIR}")
    here = f"plugins_path={model_folder / PLUGINS_SUBDIR}"
    text = re.sub(rf"^plugins_path={in_container}$", here, text, flags=re.MULTILINE)
    for key, port in (
        ("inference_address", server.inference_port),
        ("management_address", server.management_port),
        ("metrics_address", server.metrics_port),
    ):
        text = re.sub(rf"^{key}=http://[^:]+:\d+$", f"{key}=http://127.0.0.1:{port}", text, flags=re.MULTILINE)
    return text + f"grpc_inference_port={free_port()}\ngrpc_management_port={free_port()}\n"


def toolkit_properties() -> str:
    """The toolkit's file: its own (free, unused) addresses, so a torchserve that read it answers nowhere we ask."""
    ports = {"inference_address": free_port(), "management_address": free_port(), "metrics_address": free_port()}
    lines = [f"{key}=http://127.0.0.1:{port}" for key, port in ports.items()]
    lines += [f"grpc_inference_port={free_port()}", f"grpc_management_port={free_port()}"]
    lines += [f"{key}={value}" for key, value in TOOLKIT_PROPERTIES.items()]
    return "\n".join(lines) + "\n"


def _probe(server: TorchServe) -> str:
    body = {"prompt": "ping", "max_new_tokens": 1, "stream": False}
    try:
        response = httpx.post(f"{server.url}/invocations", json=body, timeout=10)
    except httpx.HTTPError as exc:
        return repr(exc)
    return "" if response.status_code == 200 else f"{response.status_code} {response.text[:200]}"


def wait_until_answering(server: TorchServe, timeout_s: float) -> None:
    """/ping can say Healthy before the model loaded: wait for a real /invocations answer."""
    deadline = time.monotonic() + timeout_s
    last = "not tried"
    while time.monotonic() < deadline and "Load model failed" not in server.log_text("ts_log.log"):
        last = _probe(server)
        if not last:
            return
        time.sleep(0.5)
    tail = "\n".join(server.log_text("ts_log.log").splitlines()[-40:])
    raise RuntimeError(f"the container view did not answer /invocations ({last}):\n{tail}")


def start_container(workdir: Path, model_folder: Path) -> TorchServe:
    """torchserve started as the DLC's toolkit starts it on a model folder (as /opt/ml/model),
    with the environment the deploy sets."""
    server = TorchServe(workdir, SAGEMAKER_MODEL_NAME, free_port(), free_port(), free_port())
    (workdir / PROPERTIES_NAME).write_text(container_properties(server, model_folder))
    (workdir / "toolkit.properties").write_text(toolkit_properties())
    plugins = model_folder / PLUGINS_SUBDIR  # as `make sagemaker-archive` lays it out
    if not plugins.exists():
        plugins.mkdir()
        shutil.copy2(build_plugins(), plugins)
    # the container's own state dir (/tmp/inf2-state) would be shared by every test run on this host
    state = workdir / "state"
    state.mkdir(exist_ok=True)
    server.env = {
        **container_environment(),
        "TS_CONFIG_FILE": str(workdir / PROPERTIES_NAME),
        "INF2_STATE_DIR": str(state),
    }
    empty_store = workdir / "ts-models"  # the toolkit's --model-store (/.sagemaker/ts/models)
    empty_store.mkdir()
    command = [str(BIN / "torchserve"), "--start", "--ts-config", str(workdir / "toolkit.properties")]
    command += ["--log-config", str(REPO / "serving" / "log4j2.xml"), "--model-store", str(empty_store)]
    command += ["--models", f"{SAGEMAKER_MODEL_NAME}={model_folder}"]  # a folder: /opt/ml/model
    with open(workdir / "torchserve.out", "wb") as out:
        subprocess.run(command, cwd=workdir, env=server._env(), stdout=out, stderr=subprocess.STDOUT, check=True)
    try:
        wait_until_answering(server, READY_TIMEOUT_S)
    except BaseException:
        server.stop()
        raise
    return server
