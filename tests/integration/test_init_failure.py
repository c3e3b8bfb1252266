"""A worker whose model fails to load (handler/serving/init_failure.py), driven the way TorchServe's
frontend drives it (tests/support/torchserve_harness.py): initialize() returns in a failed state, every
request gets a 503 JSON naming the cause in the reply shape of the frontend's mode (0.11 and
0.12 continuousBatching, classic batching), the failed-start marker is there for /ping while
the worker holds, and after the hold the marker goes and the process exits."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

import handler.serving.init_failure as init_failure
from handler.inf2_handler import Inf2StreamingHandler
from handler.serving.state import ENV_VAR as STATE_DIR_ENV
from handler.serving.state import failed_marker
from tests.support.torchserve_harness import PROTOCOL_VERSIONS, ContinuousFrontend, make_context, run_batch

BAD_VALUE = 'eight "hundred"'  # a string where the loader wants an integer


def bad_config(model_dir: Path, continuous: bool) -> dict:
    config = {
        "batchSize": 4,
        "handler": {"model_checkpoint_dir": str(model_dir), "n_positions": BAD_VALUE},
        "scheduler": {"mode": "continuous" if continuous else "static", "n_slots": 2},
    }
    if continuous:
        config["continuousBatching"] = True
    return config


@pytest.fixture
def state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(STATE_DIR_ENV, str(tmp_path / "state"))
    monkeypatch.setenv(init_failure.HOLD_ENV, "3600")  # never exits the test process; shutdown() cancels it
    return tmp_path / "state"


def failed_handler(model_dir: Path, continuous: bool) -> tuple[Inf2StreamingHandler, object]:
    handler = Inf2StreamingHandler()
    context = make_context(bad_config(model_dir, continuous), str(model_dir))
    handler.initialize(context)  # returns: TorchServe marks the worker loaded and routes requests to it
    return handler, context


def assert_names_the_cause(body: str) -> None:
    error = json.loads(body)["error"]
    assert error["type"] == "model_load_failed"
    assert "ConfigError" in error["message"] and "handler.n_positions" in error["message"]
    assert BAD_VALUE in error["message"]


@pytest.mark.parametrize("version", PROTOCOL_VERSIONS)
def test_continuous_every_request_gets_one_plain_503(tiny_model_dir, state_dir, monkeypatch, version):
    monkeypatch.setattr(init_failure, "ONE_SHOT_REPLIES", version >= (0, 12))
    handler, context = failed_handler(tiny_model_dir, continuous=True)
    try:
        assert isinstance(handler.serving, init_failure.FailedServing)
        frontend = ContinuousFrontend(handler, context, batch_size=4, version=version)
        bodies = [{"prompt": "a", "stream": True}, {"prompt": "b", "stream": False}, "plain text", "{broken json"]
        first = [frontend.submit(body) for body in bodies]
        frontend.call()
        late = frontend.submit({"model": "m", "prompt": "c"})  # OpenAI-shaped: OpenAI's error object
        frontend.run(max_calls=10)
        for request_id in [*first, late]:
            reply = frontend.replies[request_id]
            assert (reply.status, reply.content_type, reply.done, reply.broken) == (
                503,
                "application/json",
                True,
                False,
            ), request_id
            assert_names_the_cause(reply.body)
        assert json.loads(frontend.replies[late].body)["error"]["code"] is None  # the OpenAI shape
    finally:
        handler.shutdown()


def test_static_batch_answers_each_request_503(tiny_model_dir, state_dir):
    handler, context = failed_handler(tiny_model_dir, continuous=False)
    try:
        replies = run_batch(handler, context, [{"prompt": "a"}, b"plain bytes"])
        for reply in replies:
            assert (reply.status, reply.content_type, reply.chunks) == (503, "application/json", [])
            assert_names_the_cause(reply.final)
    finally:
        handler.shutdown()


def test_a_tgi_endpoint_answers_tgi_bodies_in_tgis_error_shape(tiny_model_dir, state_dir):
    """`handler.no_route_api: tgi` (a TGI-configured SageMaker endpoint): an `inputs` body without a
    route gets TGI's error shape from the failed worker too, as it would from a loaded one."""
    handler = Inf2StreamingHandler()
    config = bad_config(tiny_model_dir, continuous=False)
    config["handler"]["no_route_api"] = "tgi"
    context = make_context(config, str(tiny_model_dir))
    handler.initialize(context)
    try:
        tgi, native = run_batch(handler, context, [{"inputs": "a"}, {"prompt": "a"}])
        assert tgi.status == native.status == 503
        body = json.loads(tgi.final)
        assert set(body) == {"error", "error_type"} and body["error_type"] == "generation"  # TGI's own shape
        assert "ConfigError" in body["error"] and BAD_VALUE in body["error"]
        assert_names_the_cause(native.final)  # {"error": {"message", "type", ...}}
    finally:
        handler.shutdown()


def test_the_marker_names_the_cause_while_the_worker_holds(tiny_model_dir, state_dir):
    handler, _ = failed_handler(tiny_model_dir, continuous=True)
    try:
        cause = json.loads(failed_marker(state_dir).read_text())["cause"]
        assert cause.startswith("ConfigError: ") and BAD_VALUE in cause
    finally:
        handler.shutdown()
    assert not failed_marker(state_dir).exists()  # stopped by TorchServe: nothing left for /ping


def test_after_the_hold_the_marker_goes_and_the_process_exits(tmp_path):
    marker = init_failure.write_marker(tmp_path, "RuntimeError: boom")
    exited = threading.Event()
    codes: list[int] = []

    def fake_exit(code: int) -> None:
        codes.append(code)
        exited.set()

    serving = init_failure.FailedServing("RuntimeError: boom", 0.05, marker, exit_process=fake_exit)
    assert exited.wait(10)
    assert codes == [init_failure.EXIT_CODE] and not marker.exists()
    serving.shutdown()


def test_a_long_cause_is_bounded():
    cause = init_failure.describe(ValueError("x" * 10_000))
    assert cause.startswith("ValueError: x") and len(cause) <= init_failure.MAX_CAUSE_CHARS + 3
