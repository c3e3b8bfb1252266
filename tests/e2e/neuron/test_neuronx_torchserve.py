"""A real torchserve with the fake transformers-neuronx on the workers' PYTHONPATH: two
workers on one host compile once between them, pin disjoint NeuronCores (TorchServe's
gpu_id), stream over HTTP, and a restart loads the saved artifacts without compiling.

Works with TorchServe 0.12 (token authorization, keys in key_file.json) and 0.11 (no
token authorization: no key file, and the harness's `server.headers` is empty)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import pytest

from tests.support.modes import MODES, with_mode
from tests.support.neuron import FAKES, calls, neuronx_yaml
from tests.support.torchserve_process import TorchServe, copy_logs_on_failure, free_port, start_torchserve

WORKERS = {"static": 2, "continuous": 1}
HOLD_AT_STEP = 8  # the decode step at which the fake waits while the hold file exists (see _hold.py)


def hold_file(call_log: Path) -> Path:
    """While this file exists, the workers' fake model waits at decode step HOLD_AT_STEP."""
    return call_log.with_name("hold-generation")


def serve(workdir: Path, checkpoint: Path, call_log: Path, mode: str) -> TorchServe:
    """Static mode with two workers (one NeuronCore each); continuous mode with one (TorchServe's
    frontend stalls a continuous worker while another idles, so handler/config.py allows one)."""
    workers = WORKERS[mode]
    config = with_mode(neuronx_yaml(checkpoint, workers=workers, n_slots=2, neuronx={"num_cores": 2}), mode, 2)
    config["responseTimeout"] = 60
    env = {
        "PYTHONPATH": str(FAKES),
        "FAKE_NEURONX_CALL_LOG": str(call_log),
        "FAKE_NEURONX_HOLD_FILE": str(hold_file(call_log)),
        "FAKE_NEURONX_HOLD_AT_STEP": str(HOLD_AT_STEP),
        "INF2_NEURON_CORE_LOCK_DIR": str(workdir / "core-locks"),
        # TorchServe 0.12 hands out gpu_id only up to min(number_of_gpu, GPUs it can count), and it
        # counts CUDA_VISIBLE_DEVICES entries; on inf2 that is how workers get distinct ordinals.
        "CUDA_VISIBLE_DEVICES": "0,1",
    }
    properties = {
        "number_of_gpu": "2",
        # gRPC listens on 7070/7071 by default: another torchserve on this host would make startup fail
        "grpc_inference_port": str(free_port()),
        "grpc_management_port": str(free_port()),
    }
    try:
        server = start_torchserve(workdir, checkpoint, config, env=env, extra_properties=properties)
    except json.JSONDecodeError:
        # tests/support/torchserve_process.py reads key_file.json while torchserve may still be writing it
        # (reported to the lead); that server was stopped, so start once more in a fresh folder
        server = start_torchserve(
            workdir.with_name(workdir.name + "-retry"), checkpoint, config, env, extra_properties=properties
        )
    try:
        wait_for_workers(server, workers)
    except BaseException:
        server.stop()
        raise
    return server


def wait_for_workers(server: TorchServe, count: int, timeout: float = 90) -> None:
    """start_torchserve returns once one worker answers; wait until `count` are READY (management API)."""
    headers = server.management_headers
    url = f"http://127.0.0.1:{server.management_port}/models/{server.model_name}"
    deadline = time.monotonic() + timeout
    workers: list = []
    while time.monotonic() < deadline:
        response = httpx.get(url, headers=headers, timeout=10)
        workers = response.json()[0]["workers"] if response.status_code == 200 else []
        if sum(w["status"] == "READY" for w in workers) >= count:
            return
        time.sleep(0.5)
    raise RuntimeError(f"{count} workers were not READY within {timeout} s: {workers}")


@pytest.fixture(scope="module", params=MODES)
def deployment(request, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp(f"neuronx-ts-{request.param}")
    checkpoint = root / "model"
    shutil.copytree(tiny_model_dir, checkpoint)
    call_log = root / "calls.jsonl"
    server = serve(root / "first", checkpoint, call_log, request.param)
    server.mode = request.param
    try:
        yield server, call_log
    finally:
        server.stop()
        copy_logs_on_failure(server, root / "first-logs")


def wait_for_call(call_log: Path, name: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not calls(call_log, name):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the fake recorded no {name!r} call within {timeout} s")
        time.sleep(0.05)


def test_workers_compile_once_and_pin_disjoint_cores(deployment):
    server, call_log = deployment
    started = calls(call_log, "to_neuron")
    if WORKERS[server.mode] == 1:
        assert [c["mode"] for c in started] == ["compile"] and started[0]["visible_cores"] in {"0", "1"}
        return
    assert sorted(c["mode"] for c in started) == ["compile", "load"]  # the second waited for the first's artifacts
    assert sorted(c["visible_cores"] for c in started) == ["0", "1"]
    assert len({c["pid"] for c in started}) == 2
    assert all("--model-type=transformer" in c["cc_flags"] for c in started)


def test_request_streams_end_to_end_while_generating(deployment):
    """The first chunk reaches the client while generation cannot have ended: the worker's
    model is held at decode step HOLD_AT_STEP until the client has it. A server that buffered
    the response would send nothing until the hold times out, and its first chunk would come
    after the fake recorded the release (asserted below)."""
    server, call_log = deployment
    hold = hold_file(call_log)
    body = {"prompt": "Once upon a time", "max_new_tokens": 24, "ignore_eos": True}
    arrivals: list[tuple[float, str]] = []  # (perf_counter when the client got it, chunk)
    hold.touch()
    try:
        with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
            chunks = response.iter_raw()
            arrivals.append((time.perf_counter(), next(chunks).decode()))
            released_at_first_chunk = calls(call_log, "release")
            wait_for_call(call_log, "hold")  # generation reached the held step: no chunk after it yet
            hold.unlink()
            released = time.perf_counter()
            arrivals += [(time.perf_counter(), chunk.decode()) for chunk in chunks]
            assert response.status_code == 200
            assert response.headers["content-type"] == "application/x-ndjson"
    finally:
        hold.unlink(missing_ok=True)
    timeline = [(round(t - arrivals[0][0], 3), text) for t, text in arrivals]
    assert not released_at_first_chunk, f"the first chunk came only after generation was released: {timeline}"
    [held] = calls(call_log, "release")
    assert held["step"] == HOLD_AT_STEP and not held["timed_out"]  # the hold happened, and it was this test's
    assert any(t > released for t, _ in arrivals[1:]), f"nothing arrived after the release: {timeline}"
    lines = [json.loads(line) for line in "".join(text for _, text in arrivals).splitlines() if line]
    assert len(arrivals) > 2
    assert lines[-1]["finish_reason"] == "length" and lines[-1]["usage"]["completion_tokens"] == 24


def test_prompt_longer_than_n_positions_gets_400(deployment):
    server, _ = deployment
    body = {"prompt": "the weather is nice " * 200, "max_new_tokens": 4}
    response = httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 400
    assert "n_positions (256)" in response.json()["error"]["message"]


def test_restart_loads_saved_artifacts_without_compiling(deployment, tmp_path):
    server, call_log = deployment
    server.stop()
    compiled_before = len([c for c in calls(call_log, "to_neuron") if c["mode"] == "compile"])
    checkpoint = Path(calls(call_log, "from_pretrained")[0]["path"])
    workers = WORKERS[server.mode]
    second = serve(tmp_path / "second", checkpoint, call_log, server.mode)
    try:
        restarted = calls(call_log, "to_neuron")[workers:]
        assert [c["mode"] for c in restarted] == ["load"] * workers
        assert len([c for c in calls(call_log, "to_neuron") if c["mode"] == "compile"]) == compiled_before == 1
        response = httpx.post(
            second.predictions_url, json={"prompt": "Hello", "stream": False}, headers=second.headers, timeout=60
        )
        assert response.status_code == 200
    finally:
        second.stop()
