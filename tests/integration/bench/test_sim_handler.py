"""The sim backend behind the real handler (TorchServe's worker path, no Java), no sleeping."""

import json
import re

import pytest

from handler.inf2_handler import Inf2StreamingHandler
from tests.support.bench import sim_model_yaml
from tests.support.torchserve_harness import load_failure, make_context, run_batch


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(sim_model_yaml(tiny_model_dir, mean_natural_tokens=6), str(tiny_model_dir))
    handler.initialize(context)
    yield handler, context
    handler.shutdown()


def one(served, body):
    handler, context = served
    (reply,) = run_batch(handler, context, [body])
    return reply


def test_fixed_length_stream_through_the_handler(served):
    reply = one(served, {"prompt": "Today the weather is", "max_new_tokens": 40, "ignore_eos": True})
    assert reply.status == 200
    last = reply.lines[-1]
    assert last["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 40
    assert len(reply.chunks) >= 40  # one chunk per simulated token (text tokens only)
    again = one(served, {"prompt": "Today the weather is", "max_new_tokens": 40, "ignore_eos": True})
    assert again.streamed_text == reply.streamed_text


def test_eos_without_ignore_eos(served):
    reply = one(served, {"prompt": "Once upon a time", "max_new_tokens": 200, "stream": False})
    result = json.loads(reply.final)
    assert result["finish_reason"] == "eos"
    assert 1 <= result["usage"]["completion_tokens"] < 12


def test_stop_string_ends_the_request(served):
    full = one(served, {"prompt": "A long story", "max_new_tokens": 60, "ignore_eos": True, "stream": False})
    text = json.loads(full.final)["text"]
    stop = text[20:23]
    cut = text.find(stop)
    reply = one(
        served, {"prompt": "A long story", "max_new_tokens": 60, "ignore_eos": True, "stream": False, "stop": stop}
    )
    result = json.loads(reply.final)
    assert result["finish_reason"] == "stop"
    assert result["text"] == text[:cut]
    assert result["usage"]["completion_tokens"] < 60


def test_a_micro_batch_of_several_requests(served):
    handler, context = served
    bodies = [{"prompt": f"Request number {i}", "max_new_tokens": 5 + i, "ignore_eos": True} for i in range(5)]
    replies = run_batch(handler, context, bodies)
    assert [r.lines[-1]["usage"]["completion_tokens"] for r in replies] == [5, 6, 7, 8, 9]


def test_slots_other_than_the_compiled_batch_fail_initialize(tiny_model_dir):
    """The 7B profile is compiled for batch 8: scheduler.n_slots must say 8."""
    raw = sim_model_yaml(tiny_model_dir, micro_batch_size=4)
    raw["scheduler"]["n_slots"] = 4
    handler = Inf2StreamingHandler()
    try:
        cause = load_failure(handler, make_context(raw, str(tiny_model_dir)))
        assert re.match(r"ConfigError: .*scheduler\.n_slots \(4\) does not match the sim model's 8 slots", cause)
    finally:
        handler.shutdown()
