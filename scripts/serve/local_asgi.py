"""A real ASGI frontend (`python -m handler.frontend`: uvicorn in a subprocess, real HTTP) with
the surface of scripts/serve/local_torchserve.py's `TorchServe` that the route tests and the
benchmarks use (url, predictions_url, headers, model_name, mode, log_text, stop), so one test
runs against both frontends (tests/support/asgi_frontend.py; tests/e2e/conftest.py keeps only the
modules marked `both_frontends`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from scripts.serve.local_torchserve import free_port

REPO = Path(__file__).resolve().parents[2]
ASGI = "asgi"
READY_TIMEOUT_S = 120
STOP_TIMEOUT_S = 40  # uvicorn's drain (25 s at most) and the model's release


@dataclass
class AsgiFrontend:
    workdir: Path
    model_name: str
    port: int
    process: subprocess.Popen[bytes]
    sagemaker: bool = False
    mode: str = "continuous"
    frontend: str = ASGI
    env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def predictions_url(self) -> str:
        return f"{self.url}/predictions/{self.model_name}"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key.txt"

    @property
    def key(self) -> str:
        return self.key_file.read_text().strip()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    @property
    def inference_port(self) -> int:
        """TorchServe's name for the port the routes are on (the tests probe either by it)."""
        return self.port

    def worker_pids(self) -> list[int]:
        """The process that runs the engine: the frontend's own (it has no worker processes)."""
        return [self.process.pid] if self.process.poll() is None else []

    def scrape_metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text

    def log_text(self, name: str = "frontend.log") -> str:
        path = self.workdir / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> int | None:
        """SIGTERM (as SageMaker and systemd stop it), then wait; its exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        return self.process.returncode


def asgi_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """A TorchServe model-config as the ASGI frontend serves it: continuous scheduling (the checkpoint
    is passed as --model-dir, as `make serve MODEL_DIR=` names it). An embedding archive's config
    (`handler.task: embed`: classic batching) is served as it is."""
    if (model_config.get("handler") or {}).get("task") == "embed":
        return dict(model_config)
    config = {k: v for k, v in model_config.items() if k != "micro_batching"}
    config["handler"] = dict(model_config.get("handler", {}))  # its checkpoint: --model-dir
    scheduler = dict(model_config.get("scheduler") or {})
    scheduler["mode"] = "continuous"
    config["scheduler"] = scheduler
    config["continuousBatching"] = True
    return config


def start_asgi_frontend(
    workdir: Path,
    model_dir: Path,
    model_config: dict[str, Any],
    env: dict[str, str] | None = None,
    model_name: str = "llama",
    sagemaker: bool = False,
    extra_args: tuple[str, ...] = (),
    wait: bool = True,
    sagemaker_entry: bool = False,
) -> AsgiFrontend:
    """`sagemaker_entry`: started as a SageMaker container starts it (`python -m handler.frontend.sagemaker
    serve`), with workdir/opt-ml-model as /opt/ml/model (the config in it names the checkpoint)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = asgi_model_config(model_config)
    port = free_port()
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}
    if sagemaker_entry:
        container_model_dir = workdir / "opt-ml-model"
        container_model_dir.mkdir(exist_ok=True)
        config["handler"] = {**config["handler"], "model_checkpoint_dir": str(model_dir.resolve())}
        (container_model_dir / "model-config.yaml").write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "handler.frontend.sagemaker", "serve"]  # what SageMaker runs: no options
        full_env |= {
            "SM_MODEL_DIR": str(container_model_dir),
            "SAGEMAKER_BIND_TO_PORT": str(port),
            "INF2_KEY_FILE": str(workdir / "key.txt"),
            "INF2_MODEL_NAME": model_name,
        }
        full_env.pop("INF2_API_KEY", None)
        sagemaker = True
    else:
        config_path = workdir / "model-config.yaml"
        config_path.write_text(yaml.safe_dump(config))
        command = [sys.executable, "-m", "handler.frontend", "--config", str(config_path), "--model-name", model_name]
        command += ["--model-dir", str(model_dir), "--port", str(port), "--host", "127.0.0.1"]
        command += ["--key-file", str(workdir / "key.txt"), *extra_args]
        if sagemaker:
            command.append("--sagemaker")
    (workdir / "logs").mkdir(parents=True, exist_ok=True)  # where TorchServe's go: one copy rule for both
    with open(workdir / "logs" / "frontend.log", "wb") as log:
        process = subprocess.Popen(command, cwd=REPO, env=full_env, stdout=log, stderr=subprocess.STDOUT)
    server = AsgiFrontend(workdir, model_name, port, process, sagemaker, env=dict(env or {}))
    if wait:
        try:
            wait_ready(server)
        except BaseException:
            server.stop()
            raise
    return server


@contextlib.contextmanager
def running_asgi_frontend(*args: Any, **kwargs: Any) -> Iterator[AsgiFrontend]:
    """`start_asgi_frontend(...)`'s server, stopped on leaving the block (a failure in it too)."""
    server = start_asgi_frontend(*args, **kwargs)
    try:
        yield server
    finally:
        server.stop()


def wait_ready(server: AsgiFrontend, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            break
        try:
            headers = server.headers if server.key_file.exists() else {}
            response = httpx.get(f"{server.url}/ping", headers=headers, timeout=5)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except (httpx.HTTPError, OSError) as exc:
            last = repr(exc)
        time.sleep(0.3)
    tail = "\n".join(server.log_text().splitlines()[-40:])
    raise RuntimeError(f"the ASGI frontend did not become ready ({last}):\n{tail}")
