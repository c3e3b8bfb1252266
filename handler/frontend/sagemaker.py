"""SageMaker bring-your-own-container entry point: `python -m handler.frontend.sagemaker serve`
(docker/Dockerfile.asgi runs it; scripts/sagemaker/serve is the same as a `serve` executable).

SageMaker starts the image as `docker run <image> serve` with the model data unpacked at
/opt/ml/model, sends `GET /ping` and `POST /invocations` to port 8080, and stops the container with
SIGTERM, then SIGKILL 30 s later. This reads /opt/ml/model/model-config.yaml (the archive's own: a
relative checkpoint lies beside it) and runs the ASGI frontend with --sagemaker on 0.0.0.0:8080:
/ping and /invocations open, every other route behind the bearer key ($INF2_API_KEY, else a key
written to $INF2_KEY_FILE, /tmp/frontend-key.txt by default).

Environment (for tests and other layouts): SM_MODEL_DIR (default /opt/ml/model),
SAGEMAKER_BIND_TO_PORT (default 8080; SageMaker sets it for inference pipelines),
INF2_MODEL_NAME (the name in /predictions/<model> and /v1/models; default `model`, as TorchServe's
SageMaker toolkit names it), INF2_KEY_FILE.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from handler.frontend.__main__ import main as frontend_main
from handler.frontend.auth import KEY_ENV

MODEL_DIR_ENV = "SM_MODEL_DIR"
PORT_ENV = "SAGEMAKER_BIND_TO_PORT"
MODEL_NAME_ENV = "INF2_MODEL_NAME"
KEY_FILE_ENV = "INF2_KEY_FILE"
CONTAINER_MODEL_DIR = "/opt/ml/model"
CONFIG_NAME = "model-config.yaml"
DEFAULT_KEY_FILE = "/tmp/frontend-key.txt"  # /opt/ml/model may be read-only


def frontend_argv(environ: Mapping[str, str]) -> list[str]:
    """The `python -m handler.frontend` arguments for this container's environment."""
    model_dir = Path(environ.get(MODEL_DIR_ENV, CONTAINER_MODEL_DIR))
    argv = ["--config", str(model_dir / CONFIG_NAME), "--sagemaker", "--host", "0.0.0.0"]
    argv += ["--port", environ.get(PORT_ENV, "8080"), "--model-name", environ.get(MODEL_NAME_ENV, "model")]
    if environ.get(KEY_ENV) is None:
        argv += ["--key-file", environ.get(KEY_FILE_ENV, DEFAULT_KEY_FILE)]
    return argv


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if args not in ([], ["serve"]):
        raise SystemExit(
            f"usage: {Path(sys.argv[0]).name} [serve]  (SageMaker runs the image with `serve`); got {args}"
        )
    config = Path(frontend_argv(os.environ)[1])
    if not config.is_file():
        raise SystemExit(f"{config} is missing: the model data must hold the archive's {CONFIG_NAME}")
    frontend_main(frontend_argv(os.environ))


if __name__ == "__main__":
    main()
