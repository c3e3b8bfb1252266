"""Draining through the real handler, driven as TorchServe drives it (continuous: the
ContinuousFrontend of tests/support/torchserve_harness.py, both releases' protocols; static:
run_batch), with the tiny model on CPU: a new request gets a 503, the streams in flight go
on, and at the deadline each ends with an error line, never cut without one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import handler.serving.jobs as jobs
from handler.inf2_handler import Inf2StreamingHandler
from handler.serving import drain
from handler.serving.state import DRAIN_FILE, ENV_VAR, drained_marker, write_drain
from tests.support.torchserve_harness import PROTOCOL_VERSIONS, ContinuousFrontend, make_context, run_batch

N_SLOTS = 2
LONG = {"prompt": "Once upon a time", "max_new_tokens": 100, "ignore_eos": True}


def model_yaml(model_dir: Path, mode: str) -> dict:
    config = {
        "batchSize": 2 * N_SLOTS,
        "handler": {"model_checkpoint_dir": str(model_dir), "n_positions": 256, "max_new_tokens": 200},
        "scheduler": {"mode": mode, "n_slots": N_SLOTS},
    }
    if mode == "continuous":
        config["continuousBatching"] = True
    else:
        config["micro_batching"] = {"micro_batch_size": N_SLOTS, "parallelism": {"inference": 1}}
    return config


def serve(model_dir: Path, mode: str, state_dir: Path, monkeypatch) -> tuple[Inf2StreamingHandler, object]:
    monkeypatch.setenv(ENV_VAR, str(state_dir))
    handler = Inf2StreamingHandler()
    context = make_context(model_yaml(model_dir, mode), str(model_dir))
    handler.initialize(context)
    handler.serving.drain.stop()  # the tests poll by hand
    return handler, context


@pytest.mark.parametrize("version", PROTOCOL_VERSIONS)
def test_continuous_drain(tiny_model_dir, tmp_path, monkeypatch, version):
    monkeypatch.setattr(jobs, "ONE_SHOT_REPLIES", version >= (0, 12))
    handler, context = serve(tiny_model_dir, "continuous", tmp_path, monkeypatch)
    watcher = handler.serving.drain
    try:
        frontend = ContinuousFrontend(handler, context, batch_size=4, version=version)
        streams = [frontend.submit(LONG), frontend.submit({**LONG, "prompt": "In a galaxy far away"})]
        whole = frontend.submit({**LONG, "stream": False})  # waits for a slot
        for _ in range(200):  # until both streams have sent two lines: counted in lines, not calls,
            # since a call on a busy machine may bring no token (a flake seen once)
            if all(len(frontend.replies[request_id].lines) >= 2 for request_id in streams):
                break
            frontend.call()
        write_drain(tmp_path, grace_s=600)
        watcher.poll()
        late = frontend.submit({"prompt": "too late", "max_new_tokens": 5})
        openai_late = frontend.submit({"model": "m", "prompt": "too late", "max_tokens": 5})
        for _ in range(3):
            frontend.call()
        for request_id, error_type in ((late, "service_unavailable"), (openai_late, "service_unavailable")):
            reply = frontend.replies[request_id]
            assert (reply.status, reply.done, reply.broken) == (503, True, False)
            assert json.loads(reply.body)["error"]["type"] == error_type
        for request_id in streams:
            assert not frontend.replies[request_id].done, "a stream in flight was ended at the drain"
        watcher.poll()
        watcher.poll()
        assert not drained_marker(tmp_path).exists(), "marked drained with streams in flight"

        write_drain(tmp_path, grace_s=0)  # the deadline passes
        watcher.poll()
        frontend.run()
        for request_id in streams:
            reply = frontend.replies[request_id]
            assert reply.status == 200 and reply.done and not reply.broken
            assert reply.lines[-1]["error"]["message"] == drain.CUT and "finish_reason" not in reply.lines[-1]
            assert len(reply.lines) > 2  # it streamed until the deadline
        reply = frontend.replies[whole]
        assert (reply.status, reply.done, reply.broken) == (503, True, False)
        assert json.loads(reply.body)["error"]["message"] == drain.CUT
        assert handler.serving.engine.occupied == 0 and not handler.serving.busy()
        watcher.poll()
        watcher.poll()
        assert drained_marker(tmp_path).exists()

        (tmp_path / DRAIN_FILE).unlink()  # withdrawn: serving again
        watcher.poll()
        (after,) = frontend.serve([{"prompt": "back again", "max_new_tokens": 4, "stream": False}])
        assert after.status == 200
    finally:
        handler.shutdown()


def test_static_drain(tiny_model_dir, tmp_path, monkeypatch):
    handler, context = serve(tiny_model_dir, "static", tmp_path, monkeypatch)
    watcher = handler.serving.drain
    try:
        write_drain(tmp_path, grace_s=600)
        watcher.poll()
        (refused,) = run_batch(handler, context, [{"prompt": "too late", "max_new_tokens": 5}])
        assert refused.status == 503 and json.loads(refused.final)["error"]["message"] == drain.REFUSED
        (tmp_path / DRAIN_FILE).unlink()
        watcher.poll()

        # A micro-batch in flight when the deadline passes: a stream with text out ends with an error line.
        backend = handler.serving.service.backend
        original = backend.decode
        decodes = 0

        def decode(slots):
            nonlocal decodes
            decodes += 1
            if decodes == 5:
                write_drain(tmp_path, grace_s=0)
                watcher.poll()
            return original(slots)

        backend.decode = decode
        (cut,) = run_batch(handler, context, [LONG])
        lines = cut.lines
        assert cut.status == 200 and len(lines) > 2
        assert lines[-1]["error"]["message"] == drain.CUT and all("text" in line for line in lines[:-1])
        for _ in range(4):  # idle for maxBatchDelay (100 ms) + 0.2 s: no batch can still be on its way
            assert not drained_marker(tmp_path).exists()
            watcher.poll()
        assert drained_marker(tmp_path).exists()
    finally:
        handler.shutdown()
