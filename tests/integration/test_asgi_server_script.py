"""`make serve FRONTEND=asgi` and `make stop` for the ASGI frontend (scripts/serve/asgi_server.py):
the frontend starts in the background and the command returns once /ping answers 200 with the
key; a frontend that exits or fails to load is stopped and its log's tail shown; `make stop`
(scripts/serve/stop_server.py --asgi-pid-file) sends SIGTERM and waits. A stand-in frontend (a
small HTTP server whose command line names `handler.frontend`) keeps these tests fast; the real
one through the Makefile is tests/e2e/test_make_serve_asgi.py."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from scripts.serve import asgi_server, stop_server
from tests.support.torchserve_process import free_port

# A stand-in for `python -m handler.frontend`: writes its key file when absent, answers /ping with the
# key (503 until `ready_after` seconds, or 503 "failed to load" for ever with --fail), drains on SIGTERM.
STANDIN = r"""
import http.server, json, os, pathlib, secrets, signal, sys, threading, time
args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
key_file = pathlib.Path(args["--key-file"])
if not key_file.exists():
    key_file.write_text(secrets.token_hex(8) + "\n")
key = key_file.read_text().strip()
started, ready_after = time.monotonic(), float(args.get("--ready-after", "0"))
if args.get("--exit-now"):
    print("cannot start: port taken", flush=True)
    sys.exit(3)
class Ping(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.headers.get("Authorization") != f"Bearer {key}":
            status, body = 401, {"error": "key"}
        elif args.get("--fail"):
            status, body = 503, {"status": "Unhealthy", "message": "the model failed to load: ConfigError: no"}
        elif time.monotonic() - started < ready_after:
            status, body = 503, {"status": "Loading", "message": "loading"}
        else:
            status, body = 200, {"status": "Healthy"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def log_message(self, *a):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", int(args["--port"])), Ping)
def drain(*_):
    print("draining", flush=True)
    threading.Thread(target=server.shutdown).start()
signal.signal(signal.SIGTERM, drain)
print("serving", flush=True)
server.serve_forever()
print("stopped", flush=True)
"""


def standin(port: int, key_file: Path, *extra: str) -> list[str]:
    return [sys.executable, "-c", STANDIN, "--module", "handler.frontend", "--port", str(port)] + [
        "--key-file",
        str(key_file),
        *extra,
    ]


@pytest.fixture
def paths(tmp_path: Path) -> dict[str, Path]:
    return {"pid": tmp_path / "build" / "asgi.pid", "log": tmp_path / "logs" / "asgi.log", "key": tmp_path / "key.txt"}


def test_it_returns_once_ping_answers_with_the_key_and_make_stop_stops_it(paths):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = standin(port, paths["key"], "--ready-after", "0.5")
    waited = asgi_server.start(command, paths["pid"], paths["log"], url, paths["key"], timeout=30)
    try:
        assert waited >= 0.4  # it waited through the 503s
        process = asgi_server.running_frontend(paths["pid"])
        assert process is not None and process.is_running()
        assert process.pid != psutil.Process().pid and process.ppid() == psutil.Process().pid
        headers = {"Authorization": f"Bearer {paths['key'].read_text().strip()}"}
        assert httpx.get(f"{url}/ping", headers=headers, timeout=5).status_code == 200
        with pytest.raises(RuntimeError, match="already runs"):  # a second `make serve FRONTEND=asgi`
            asgi_server.start(command, paths["pid"], paths["log"], url, paths["key"], timeout=30)
    finally:
        took = asgi_server.stop(paths["pid"], grace_s=1)
    assert took is not None and took < asgi_server.STOP_MARGIN_S
    process.wait(5)  # reaped: it exited on its SIGTERM, not killed
    assert not paths["pid"].exists()
    assert "draining" in paths["log"].read_text()
    assert asgi_server.stop(paths["pid"], grace_s=1) is None  # nothing left to stop


def test_a_frontend_that_exits_fails_the_start_with_its_log(paths, capsys):
    port = free_port()
    argv = ["start", "--pid-file", str(paths["pid"]), "--log", str(paths["log"]), "--url", f"http://127.0.0.1:{port}"]
    argv += ["--key-file", str(paths["key"]), "--timeout", "30", "--", *standin(port, paths["key"], "--exit-now", "1")]
    with pytest.raises(SystemExit) as exited:
        asgi_server.main(argv)
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "cannot start: port taken" in err and "exited with status 3" in err
    assert not paths["pid"].exists()


def test_a_model_that_fails_to_load_stops_the_wait_at_once(paths):
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="the model failed to load"):
        asgi_server.start(
            standin(port, paths["key"], "--fail", "1"), paths["pid"], paths["log"], f"http://127.0.0.1:{port}",
            paths["key"], timeout=60,
        )  # fmt: skip
    assert time.monotonic() - started < 30
    assert not paths["pid"].exists()


def test_make_stop_stops_the_asgi_frontend_too(paths, tmp_path, capsys):
    port = free_port()
    asgi_server.start(
        standin(port, paths["key"]), paths["pid"], paths["log"], f"http://127.0.0.1:{port}", paths["key"], 30
    )
    process = asgi_server.running_frontend(paths["pid"])
    assert process is not None
    ts_pid_file = tmp_path / "build" / ".model_server.pid"  # no TorchServe runs
    # `true` stands for `torchserve --stop`: this test must not stop some other TorchServe of the host
    stop_server.main(
        ["--pid-file", str(ts_pid_file), "--asgi-pid-file", str(paths["pid"]), "--grace", "1"]
        + ["--torchserve", shutil.which("true") or "/bin/true"]
    )
    out = capsys.readouterr().out
    assert "the ASGI frontend drained and stopped in" in out
    assert "TorchServe is not running" not in out
    process.wait(5)
    assert not paths["pid"].exists()


def test_a_pid_file_naming_another_process_is_left_alone(paths):
    paths["pid"].parent.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        paths["pid"].write_text(f"{other.pid}\n")
        assert asgi_server.running_frontend(paths["pid"]) is None
        assert asgi_server.stop(paths["pid"], grace_s=1) is None
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize(
    ("cmdline", "drain"),
    [
        (["python", "-m", "handler.frontend", "--drain-s", "20"], 20.0),
        (["python", "-m", "handler.frontend", "--drain-s=7.5"], 7.5),
        (["python", "-m", "handler.frontend", "--drain-s", "20", "--drain-s", "40"], 40.0),  # FRONTEND_ARGS last
        (["python", "-m", "handler.frontend"], 25.0),
    ],
)
def test_stop_waits_for_the_drain_the_frontend_was_started_with(cmdline, drain):
    assert asgi_server.drain_s_of(cmdline, 25.0) == drain
