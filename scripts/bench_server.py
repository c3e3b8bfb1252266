"""A torchserve of its own for the benchmark: own archive, config.properties, free ports,
and its own temp directory (torchserve keeps its pid file and its workers' Unix sockets
there, so a shared one would let `--stop` stop someone else's server and two servers'
workers fight over /tmp/.ts.sock.9000), free gRPC ports. Prometheus metrics mode is on;
the frontend logs with serving/log4j2.xml (no log line per streamed chunk).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LOG_CONFIG = REPO / "serving" / "log4j2.xml"  # the one `make serve` uses: no log line per streamed chunk
METRICS_PROPERTIES = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class BenchServer:
    workdir: Path
    model_name: str
    inference_port: int
    metrics_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.inference_port}"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    def headers(self) -> dict[str, str]:
        key = json.loads(self.key_file.read_text())["inference"]["key"]
        return {"Authorization": f"Bearer {key}"}

    def env(self) -> dict[str, str]:
        tmp = self.workdir / "tmp"
        tmp.mkdir(parents=True, exist_ok=True)
        # TMPDIR: torchserve's pid file; TEMP: the JVM's java.io.tmpdir, where the worker's
        # Unix socket lives (/tmp/.ts.sock.9000 for every server on the machine otherwise).
        env = {"PATH": f"{BIN}:{os.environ['PATH']}", "HF_HUB_OFFLINE": "1", "TMPDIR": str(tmp), "TEMP": str(tmp)}
        return {**os.environ, **env}

    def log(self, name: str = "ts_log.log") -> str:
        path = self.workdir / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""

    def scrape_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    def stop(self) -> None:
        subprocess.run([str(BIN / "torchserve"), "--stop"], cwd=self.workdir, env=self.env(), capture_output=True)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.inference_port), timeout=0.2):
                    time.sleep(0.3)
            except OSError:
                return


def build_archive(workdir: Path, model_dir: Path, model_config: dict[str, Any], model_name: str) -> Path:
    config_path = workdir / "model-config.yaml"
    config_path.write_text(yaml.safe_dump(model_config, sort_keys=False))
    stage = workdir / "stage"
    subprocess.run(
        [sys.executable, str(REPO / "scripts/stage_archive.py"), "--model-dir", str(model_dir)]
        + ["--config", str(config_path), "--stage", str(stage), "--embed-model"],
        check=True,
    )
    store = workdir / "model_store"
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    subprocess.run(
        [str(BIN / "torch-model-archiver"), "--model-name", model_name, "--version", "1.0"]
        + ["--handler", str(stage / "handler/inf2_handler.py"), "--extra-files", str(stage)]
        + ["--config-file", str(stage / "model-config.yaml"), "--archive-format", "no-archive"]
        + ["--export-path", str(store), "-f"],
        check=True,
        capture_output=True,
    )
    return store


def start(
    workdir: Path, model_dir: Path, model_config: dict[str, Any], model_name: str = "llama", timeout: float = 180
) -> BenchServer:
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(workdir / "logs", ignore_errors=True)
    store = build_archive(workdir, model_dir, model_config, model_name)
    server = BenchServer(workdir, model_name, free_port(), free_port())
    properties = {
        "inference_address": f"http://127.0.0.1:{server.inference_port}",
        "management_address": f"http://127.0.0.1:{free_port()}",
        "metrics_address": f"http://127.0.0.1:{server.metrics_port}",
        "grpc_inference_port": str(free_port()),  # gRPC cannot be switched off; 7070/7071 would collide
        "grpc_management_port": str(free_port()),
        "model_store": str(store),
        "load_models": model_name,
        "default_response_timeout": "300",
        **METRICS_PROPERTIES,
    }
    (workdir / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    with open(workdir / "torchserve.out", "wb") as out:
        subprocess.run(
            [str(BIN / "torchserve"), "--start", "--ncs", "--ts-config", str(workdir / "config.properties")]
            + ["--model-store", str(store), "--models", f"{model_name}={model_name}", "--log-config", str(LOG_CONFIG)],
            cwd=workdir,
            env=server.env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    try:
        _wait_ready(server, timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: BenchServer, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer"
    url = f"{server.url}/predictions/{server.model_name}"
    while time.monotonic() < deadline:
        if "Load model failed" in server.log():
            break
        try:
            if server.key_file.exists():
                body = {"prompt": "ping", "max_new_tokens": 1, "stream": False}
                response = httpx.post(url, json=body, headers=server.headers(), timeout=30)
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}: {response.text[:200]}"
        except (httpx.HTTPError, ValueError, KeyError) as exc:  # ValueError: key_file.json half-written
            last = repr(exc)
        time.sleep(0.5)
    tail = "\n".join(server.log().splitlines()[-30:])
    raise RuntimeError(f"torchserve did not become ready ({last}):\n{tail}")
