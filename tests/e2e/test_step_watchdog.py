"""The step watchdog (`handler.step_timeout_s`, handler/core/engine_client.py) on both frontends,
driven by the hang failpoint (INF2_FAILPOINT_HANG, handler/failpoints.py): a decode step holding
the marked prompt sleeps HANG_S once. The requests in flight (the marked one and a bystander
already streaming) end with the documented error (a 500, or a last error line on an open stream)
while the step still hangs, not when it returns; a request sent after the step went on is served.

Orderings, not speeds (docs/testing.md, "Time in a test"): the hung request is sent once the
bystander streams; "while the step still hangs" is read in the server's log (the failpoint's line
that the step goes on is not there yet when both errors have arrived)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from handler.failpoints import HANG_ENV
from tests.e2e.conftest import E2E_MODEL_CONFIG
from tests.support.asgi_frontend import ASGI, running_asgi_frontend
from tests.support.modes import with_mode
from tests.support.torchserve_process import start_torchserve

pytestmark = pytest.mark.both_frontends

HANG_MARKER = "<<hang-this-step>>"
HANG_S = 8
STEP_TIMEOUT_S = 1.0
WENT_ON = f"{HANG_ENV}: the hung step goes on"


@pytest.fixture(scope="module", params=("torchserve", ASGI))
def hung_server(request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    config = with_mode(E2E_MODEL_CONFIG, "continuous")
    config["handler"] = {**config["handler"], "step_timeout_s": STEP_TIMEOUT_S}
    env = {HANG_ENV: f"{HANG_MARKER}:{HANG_S}"}
    workdir = tmp_path_factory.mktemp(f"watchdog-{request.param}")
    if request.param == ASGI:
        with running_asgi_frontend(workdir, tiny_model_dir, config, env=env) as frontend:
            yield frontend
        return
    server = start_torchserve(workdir, tiny_model_dir, config, env=env)
    try:
        yield server
    finally:
        server.stop()


def streamed(server, prompt: str, max_new_tokens: int, first_line: threading.Event | None = None) -> dict:
    """A native streamed request: its status and the lines it got."""
    body = {"prompt": prompt, "max_new_tokens": max_new_tokens, "ignore_eos": True, "stream": True}
    out: dict = {"lines": []}
    with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
        out["status"] = response.status_code
        for line in response.iter_lines():
            if line.strip():
                out["lines"].append(json.loads(line))
                if first_line is not None:
                    first_line.set()
    return out


def ended_with_the_watchdog_error(result: dict) -> bool:
    last = result["lines"][-1] if result["lines"] else {}
    message = json.dumps(last)
    if "did not finish a step within" not in message:
        return False
    return result["status"] == 500 or (result["status"] == 200 and "finish_reason" not in last)


def test_a_hung_step_ends_the_requests_in_flight_and_the_next_one_is_served(hung_server):
    results: dict[str, dict] = {}
    streaming = threading.Event()

    def run(name: str, prompt: str, tokens: int, first: threading.Event | None = None) -> None:
        results[name] = streamed(hung_server, prompt, tokens, first)

    bystander = threading.Thread(target=run, args=("bystander", "a bystander streams on", 500, streaming))
    bystander.start()
    assert streaming.wait(60), "the bystander never streamed"
    hung = threading.Thread(target=run, args=("hung", f"please {HANG_MARKER} now", 64))
    hung.start()
    for thread in (bystander, hung):
        thread.join(60)
    assert WENT_ON not in hung_server.log_text(), "the errors came only when the step returned"
    for name in ("bystander", "hung"):
        assert ended_with_the_watchdog_error(results[name]), (
            name,
            results[name]["status"],
            results[name]["lines"][-2:],
        )
    deadline = time.monotonic() + 60
    while WENT_ON not in hung_server.log_text():
        assert time.monotonic() < deadline, "the hung step never went on"
        time.sleep(0.2)
    after = streamed(hung_server, "served after the hang", 16)
    assert after["status"] == 200 and after["lines"][-1]["finish_reason"] == "length"
    assert after["lines"][-1]["usage"]["completion_tokens"] == 16
