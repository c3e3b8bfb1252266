"""`make serve` with backend nxdi, on a real torchserve with the fake NxD Inference on the
worker's PYTHONPATH (continuous mode, one worker): the first start compiles in a child
process and streams; a restart loads the saved artifacts without compiling. With two replicas
the worker's replica processes load on disjoint NeuronCores after one compile."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from tests.support.modes import with_mode
from tests.support.neuron import FAKES, calls, nxdi_yaml
from tests.support.torchserve_process import TorchServe, copy_logs_on_failure, start_torchserve


def serve(workdir: Path, checkpoint: Path, call_log: Path, replicas: int = 1) -> TorchServe:
    tp = 2 if replicas > 1 else 1
    config = with_mode(nxdi_yaml(checkpoint, n_slots=2, tp_degree=tp, nxdi={"num_cores": 4}), "continuous", 2)
    config["scheduler"]["replicas"] = replicas
    config["batchSize"] = 4 * replicas
    config["responseTimeout"] = 60
    env = {
        "PYTHONPATH": str(FAKES),
        "FAKE_NEURONX_CALL_LOG": str(call_log),
        "INF2_NEURON_CORE_LOCK_DIR": str(workdir / "core-locks"),
    }
    return start_torchserve(workdir, checkpoint, config, env=env)


def stream(server: TorchServe, prompt: str) -> list[dict]:
    body = {"prompt": prompt, "max_new_tokens": 12, "ignore_eos": True}
    with httpx.stream("POST", server.predictions_url, json=body, headers=server.headers, timeout=60) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.iter_lines() if line]


@pytest.mark.timeout(400)
def test_serve_compiles_once_then_a_restart_only_loads(tiny_model_dir: Path, tmp_path: Path):
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_model_dir, checkpoint)
    call_log = tmp_path / "calls.jsonl"
    first = serve(tmp_path / "first", checkpoint, call_log)
    try:
        lines = stream(first, "Once upon a time")
        assert len(lines) > 2 and lines[-1]["finish_reason"] == "length"
        assert lines[-1]["usage"]["completion_tokens"] == 12
        assert len(calls(call_log, "compile")) == 1
    finally:
        first.stop()
        copy_logs_on_failure(first, tmp_path / "first-logs")

    second = serve(tmp_path / "second", checkpoint, call_log)
    try:
        again = stream(second, "Once upon a time")
        assert "".join(line["text"] for line in again) == "".join(line["text"] for line in lines)  # greedy
        assert len(calls(call_log, "compile")) == 1 and calls(call_log, "load")[-1]["weights"] == "presharded"
    finally:
        second.stop()
        copy_logs_on_failure(second, tmp_path / "second-logs")


@pytest.mark.timeout(400)
def test_two_replicas_serve_from_one_compile(tiny_model_dir: Path, tmp_path: Path):
    checkpoint = tmp_path / "model"
    shutil.copytree(tiny_model_dir, checkpoint)
    call_log = tmp_path / "calls.jsonl"
    server = serve(tmp_path / "ts", checkpoint, call_log, replicas=2)
    try:
        assert stream(server, "Hello there")[-1]["finish_reason"] == "length"
        loads = calls(call_log, "load")
        assert len(calls(call_log, "compile")) == 1
        assert sorted(c["visible_cores"] for c in loads[-2:]) == ["0-1", "2-3"]
    finally:
        server.stop()
        copy_logs_on_failure(server, tmp_path / "logs")
