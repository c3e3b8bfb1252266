"""`make serve FRONTEND=asgi` behaves as `make serve` does: it returns once the ASGI frontend answers
/ping (running in the background, its log in logs/asgi.log, its pid in build/asgi.pid) and prints
how to call it; `make stop` drains and stops it, leaving no process behind."""

from __future__ import annotations

import os
import subprocess

import httpx
import psutil

from tests.support.make_checkout import free_ports, make_checkout, make_command


def test_make_serve_asgi_runs_in_the_background_until_make_stop(tiny_model_dir, tmp_path):
    checkout = make_checkout(tmp_path / "checkout")
    port = free_ports()["INFERENCE_PORT"]
    settings = ["FRONTEND=asgi", f"MODEL_DIR={tiny_model_dir}", f"INFERENCE_PORT={port}", "DRAIN_GRACE_S=2"]
    make = make_command()
    pid_file = checkout / "build" / "asgi.pid"
    try:
        served = subprocess.run(
            [*make, "serve", *settings], cwd=checkout, capture_output=True, text=True, timeout=300, env={**os.environ}
        )
        output = served.stdout + served.stderr
        assert served.returncode == 0, output[-2000:]
        assert "answered /ping" in output and "make stop" in output
        assert f"Serving llama on http://127.0.0.1:{port} (ASGI frontend" in output
        frontend = psutil.Process(int(pid_file.read_text()))
        assert any("handler.frontend" in part for part in frontend.cmdline())
        assert (checkout / "logs" / "asgi.log").exists()

        key = (checkout / "build" / "frontend-key.txt").read_text().strip()
        answer = httpx.post(
            f"http://127.0.0.1:{port}/predictions/llama",
            json={"prompt": "Hello", "max_new_tokens": 3, "stream": False},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["completion_tokens"] >= 1

        stopped = subprocess.run([*make, "stop", *settings], cwd=checkout, capture_output=True, text=True, timeout=120)
        assert "the ASGI frontend drained and stopped" in stopped.stdout, stopped.stdout + stopped.stderr
        assert not frontend.is_running() or frontend.status() == psutil.STATUS_ZOMBIE
        assert not pid_file.exists()
    finally:  # never leave it running, whatever happened
        subprocess.run([*make, "stop", "DRAIN_GRACE_S=0"], cwd=checkout, capture_output=True, timeout=120)
