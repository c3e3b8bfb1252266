"""A private `torchserve` on this host, for end-to-end tests and the benchmark.

The archive is built the way `make archive` does; every port (HTTP and gRPC) is a free one
on 127.0.0.1; token auth stays on where TorchServe has it (0.12; 0.11 has none, see
scripts/serve/torchserve_compat.py); `allowed_urls` admits only the model store; the temp dir is
private (TorchServe keeps its pid file and its workers' Unix sockets there, so a shared one
lets `--stop` stop another server and two servers' workers fight over /tmp/.ts.sock.9000);
the frontend logs with serving/log4j2.xml; /ping is the readiness plugin (serving/plugins, built
on demand by scripts/serve/build_plugins.py) and INF2_STATE_DIR is `<workdir>/state`. Callers stop it
in a `finally`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

from handler.serving.state import ENV_VAR as STATE_DIR_ENV
from scripts.serve.build_plugins import build as build_plugins
from scripts.serve.client import readiness_body
from scripts.serve.stop_server import StopReport, frontend_process, stop_torchserve, worker_processes


def allowed_urls_for(model_store: Path) -> str:
    """`allowed_urls`: only archives in the model store (TorchServe's default admits any http(s) or file URL)."""
    return f"file://{re.escape(str(model_store))}/.*"


LOCAL_PROPERTIES = REPO / "serving" / "local.properties"


def read_properties(path: Path) -> dict[str, str]:
    """A config.properties file's `key=value` lines (comments and blanks skipped)."""
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and line[0] != "#")
    return {key.strip(): value.strip() for key, value in pairs}


def local_properties() -> dict[str, str]:
    """The settings `make serve` runs with (serving/local.properties), for every local server."""
    return read_properties(LOCAL_PROPERTIES)


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now that this process has not handed out before. TorchServe binds its five
    ports only once it runs, so two calls before then must not name the same one: the kernel may
    give a closed port again (a gRPC port equal to the metrics port stopped a server at start)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


@dataclass
class TorchServe:
    workdir: Path
    model_name: str
    inference_port: int
    management_port: int
    metrics_port: int
    env: dict[str, str] = field(default_factory=dict)
    grpc_inference_port: int = 0  # gRPC cannot be switched off: it listens here (127.0.0.1)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.inference_port}"

    @property
    def predictions_url(self) -> str:
        return f"{self.url}/predictions/{self.model_name}"

    @property
    def key_file(self) -> Path:
        return self.workdir / "key_file.json"

    @property
    def headers(self) -> dict[str, str]:
        """The inference key's header; none where token auth is off (or absent: TorchServe 0.11)."""
        return self._auth("inference")

    @property
    def management_headers(self) -> dict[str, str]:
        return self._auth("management")

    def _auth(self, api: str) -> dict[str, str]:
        if not self.key_file.exists():
            return {}
        key = json.loads(self.key_file.read_text())[api]["key"]
        return {"Authorization": f"Bearer {key}"}

    def log_text(self, name: str = "model_log.log") -> str:
        path = self.workdir / "logs" / name
        return path.read_text(errors="replace") if path.exists() else ""

    def scrape_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10).text

    @property
    def state_dir(self) -> Path | None:
        """INF2_STATE_DIR of this server (drain.json, failed-<pid>.json), if it has one."""
        value = self.env.get(STATE_DIR_ENV)
        return Path(value) if value else None

    @property
    def pid_file(self) -> Path:
        return self.workdir / ".model_server.pid"  # TorchServe's, in its temp dir (see _env)

    def frontend_pid(self) -> int | None:
        frontend = frontend_process(self.pid_file)
        return None if frontend is None else frontend.pid

    def worker_pids(self) -> list[int]:
        """The Python worker processes of this server (also those its frontend left behind)."""
        return [w.pid for w in worker_processes(frontend_process(self.pid_file), self.workdir)]

    def stop(self, drain_grace_s: float | None = None) -> StopReport:
        """Stop TorchServe, after a drain of `drain_grace_s` seconds when given (needs
        INF2_STATE_DIR in the server's environment), and kill any worker process it leaves
        behind: scripts/serve/stop_server.py, what `make stop` runs."""
        if drain_grace_s and self.state_dir is None:
            raise ValueError(f"a drain needs {STATE_DIR_ENV} in the server's environment")
        report = stop_torchserve(
            self.pid_file, BIN / "torchserve", self._env(), self.workdir, self.state_dir, drain_grace_s
        )
        deadline = time.monotonic() + 20  # no pid file (a failed start): wait for the port instead
        while time.monotonic() < deadline and self._running():
            time.sleep(0.3)
        return report

    def _running(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.inference_port), timeout=0.2):
                return True
        except OSError:
            return False

    def _env(self) -> dict[str, str]:
        # TorchServe keeps its pid file in the temp dir and refuses to start (or stops the
        # wrong server) when another instance shares it: give each instance its own.
        tmp = str(self.workdir)
        return {
            **os.environ,
            "PATH": f"{BIN}:{os.environ['PATH']}",
            "HF_HUB_OFFLINE": "1",
            "TMPDIR": tmp,
            "TEMP": tmp,
            **self.env,
        }


def build_archive(
    workdir: Path, model_dir: Path, model_config: dict[str, Any], model_name: str, handler: Path | None = None
) -> Path:
    """The model store; `handler`: the archive's entry point instead of handler/inf2_handler.py."""
    config_path = workdir / "model-config.yaml"
    config_path.write_text(yaml.safe_dump(model_config))
    store = workdir / "model_store"
    subprocess.run(
        [sys.executable, "-m", "scripts.serve.stage_archive", "--model-dir", str(model_dir)]
        + ["--config", str(config_path), "--stage", str(workdir / "stage")]
        + ["--export-path", str(store), "--model-name", model_name]
        + (["--handler", str(handler)] if handler else []),
        check=True,
        cwd=REPO,
    )
    return store


def start_torchserve(
    workdir: Path,
    model_dir: Path,
    model_config: dict[str, Any],
    env: dict[str, str] | None = None,
    model_name: str = "llama",
    extra_properties: dict[str, str] | None = None,
    ready_timeout: float = 120,
    wait: bool = True,
    handler: Path | None = None,
) -> TorchServe:
    """A started torchserve, ready to answer unless `wait` is False (then it returns as soon
    as `torchserve --start` did). Its state dir (INF2_STATE_DIR, `<workdir>/state` unless
    `env` names one) starts empty; its /ping is the readiness plugin (serving/plugins)."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = build_archive(workdir, model_dir, model_config, model_name, handler)
    env = {STATE_DIR_ENV: str(workdir / "state"), **(env or {})}
    shutil.rmtree(env[STATE_DIR_ENV], ignore_errors=True)
    Path(env[STATE_DIR_ENV]).mkdir(parents=True)
    server = TorchServe(workdir, model_name, free_port(), free_port(), free_port(), env, free_port())
    properties = {
        **local_properties(),
        "inference_address": f"http://127.0.0.1:{server.inference_port}",
        "management_address": f"http://127.0.0.1:{server.management_port}",
        "metrics_address": f"http://127.0.0.1:{server.metrics_port}",
        # gRPC cannot be switched off; its fixed default ports (7070/7071) would collide.
        "grpc_inference_port": str(server.grpc_inference_port),
        "grpc_management_port": str(free_port()),
        "model_store": str(store),
        "load_models": model_name,
        "allowed_urls": allowed_urls_for(store),
        "plugins_path": str(build_plugins().parent),  # the readiness /ping
        **(extra_properties or {}),
    }
    (workdir / "config.properties").write_text("".join(f"{k}={v}\n" for k, v in properties.items()))
    with open(workdir / "torchserve.out", "wb") as out:
        subprocess.run(
            [str(BIN / "torchserve"), "--start", "--ncs", "--ts-config", str(workdir / "config.properties")]
            + ["--log-config", str(REPO / "serving" / "log4j2.xml")]
            + ["--model-store", str(store), "--models", f"{model_name}={model_name}"],
            cwd=workdir,
            env=server._env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            check=True,
        )
    if not wait:
        return server
    try:
        _wait_ready(server, ready_timeout, readiness_body(str((model_config.get("handler") or {}).get("task"))))
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: TorchServe, timeout: float, body: dict[str, Any]) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if "Load model failed" in server.log_text("ts_log.log"):
            break
        try:
            # no key yet (0.12 writes key_file.json at start; 0.11 and auth-off servers never do): 400, retried
            response = httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=10)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
            if response.status_code == 503 and "model_load_failed" in response.text:
                break  # the worker failed to initialize (handler/serving/init_failure.py): the body names the cause
        except (httpx.HTTPError, ValueError) as exc:  # ValueError: key_file.json still being written
            last = repr(exc)
        time.sleep(0.5)
    tail = "\n".join(server.log_text("ts_log.log").splitlines()[-40:])
    raise RuntimeError(f"torchserve did not become ready ({last}):\n{tail}")


def copy_logs_on_failure(server: Any, dest: Path) -> None:
    """The server's logs folder: TorchServe's, or the ASGI frontend's (scripts/serve/local_asgi.py)."""
    if (server.workdir / "logs").exists():
        shutil.copytree(server.workdir / "logs", dest, dirs_exist_ok=True)
