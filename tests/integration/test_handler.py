"""The real handler, driven as TorchServe's worker drives it, with the tiny model on CPU."""

import json
import re

import pytest

from handler.failpoints import ENV_VAR as FAILPOINT_ENV
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.torchserve_harness import (
    assert_streamed_while_generating,
    generation_ends,
    load_failure,
    make_context,
    run_batch,
)


def model_yaml(model_dir, **handler):
    return {
        "batchSize": 4,
        "handler": {"model_checkpoint_dir": str(model_dir), "n_positions": 128, "max_new_tokens": 100, **handler},
        "scheduler": {"mode": "static", "n_slots": 2},
        "micro_batching": {"micro_batch_size": 2, "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 1}},
    }


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(model_yaml(tiny_model_dir), str(tiny_model_dir))
    handler.initialize(context)
    yield handler, context
    handler.shutdown()


def batch(served, rows, headers=None):
    handler, context = served
    return run_batch(handler, context, rows, headers)


def test_streams_ndjson_with_final_usage(served, tiny_tokenizer):
    with generation_ends(served[0]) as ends:
        (reply,) = batch(served, [{"prompt": "Today the weather is", "max_new_tokens": 20, "ignore_eos": True}])
    assert reply.status == 200
    assert reply.content_type == "application/x-ndjson"
    assert_streamed_while_generating(reply, ends[-1])  # text went out before the end
    lines = reply.lines
    assert all(set(line) == {"text"} for line in lines[:-1])
    last = lines[-1]
    assert last["finish_reason"] == "length"
    assert last["usage"] == {
        "prompt_tokens": len(tiny_tokenizer("Today the weather is")["input_ids"]),
        "completion_tokens": 20,
    }


def test_eos_ends_a_row_early(served):
    # The tiny model's fixed random weights emit EOS two tokens into this prompt.
    (reply,) = batch(served, [{"prompt": "Today the weather is", "max_new_tokens": 20, "stream": False}])
    result = json.loads(reply.final)
    assert result["finish_reason"] == "eos"
    assert result["usage"]["completion_tokens"] < 20


def test_one_bad_request_fails_alone(served):
    replies = batch(
        served,
        [
            {"prompt": "Once upon a time", "max_new_tokens": 12},
            {"prompt": "bad", "top_p": 3},
            b"\xff\xfe",
            {"prompt": "The quick brown fox", "max_new_tokens": 12, "stream": False},
        ],
    )
    assert [r.status for r in replies] == [200, 400, 400, 200]
    error = json.loads(replies[1].final)["error"]
    assert error["param"] == "top_p" and error["type"] == "invalid_request_error"
    assert json.loads(replies[2].final)["error"]["param"] == "body"
    assert replies[1].content_type == "application/json"
    assert replies[0].lines[-1]["finish_reason"] in {"eos", "length"}
    assert json.loads(replies[3].final)["finish_reason"] in {"eos", "length"}


def test_batched_output_equals_output_alone(served):
    body = {"prompt": "Large language models generate text", "max_new_tokens": 24, "stream": False}
    (alone,) = batch(served, [body])
    mates = [{"prompt": "x", "max_new_tokens": 30}, {"prompt": "a much longer prompt than the other one " * 2}]
    together = batch(served, [mates[0], body, mates[1]])
    assert json.loads(together[1].final)["text"] == json.loads(alone.final)["text"]


def test_seeded_sampling_is_reproducible_whatever_the_batch(served):
    body = {"prompt": "Once upon a time", "max_new_tokens": 24, "temperature": 1.3, "seed": 7, "stream": False}
    (first,) = batch(served, [body])
    _, second = batch(served, [{"prompt": "other", "temperature": 0.9}, body])
    (other_seed,) = batch(served, [{**body, "seed": 8}])
    assert json.loads(first.final)["text"] == json.loads(second.final)["text"]
    assert json.loads(first.final)["text"] != json.loads(other_seed.final)["text"]


def test_stop_string_ends_the_row(served):
    body = {"prompt": "Streaming sends", "max_new_tokens": 40, "stream": False, "ignore_eos": True}
    (free,) = batch(served, [body])
    text = json.loads(free.final)["text"]
    stop = text[5:7]
    assert len(stop) == 2
    (stopped,) = batch(served, [{**body, "stop": [stop]}])
    result = json.loads(stopped.final)
    assert result["finish_reason"] == "stop"
    assert result["text"] == text[: text.index(stop)]


def test_length_limits_against_n_positions(served):
    long_prompt = "word " * 200
    too_long, too_much = batch(
        served, [{"prompt": long_prompt}, {"prompt": "word " * 40, "max_new_tokens": 100, "stream": False}]
    )
    assert too_long.status == 400 and json.loads(too_long.final)["error"]["param"] == "prompt"
    assert too_much.status == 400 and json.loads(too_much.final)["error"]["param"] == "max_new_tokens"
    assert "n_positions (128)" in json.loads(too_much.final)["error"]["message"]


@pytest.mark.parametrize(
    "row",
    [
        {"body": b"Today the weather is"},
        {"body": "Today the weather is"},
        {"data": bytearray(b'{"inputs": "Today the weather is", "parameters": {"max_new_tokens": 5}}')},
        {"body": {"inputs": "Today the weather is", "parameters": {"max_new_tokens": 5}}, "model_name": "llama"},
    ],
)
def test_body_shapes(served, row):
    (reply,) = batch(served, [row])
    assert reply.status == 200, reply.final
    assert reply.lines[-1]["finish_reason"] in {"eos", "length"}


def test_failure_inside_generate_answers_and_worker_keeps_serving(served, monkeypatch):
    monkeypatch.setenv(FAILPOINT_ENV, "FAIL-HERE")
    with generation_ends(served[0]) as ends:
        streamed, whole = batch(
            served,
            [
                {"prompt": "FAIL-HERE please", "max_new_tokens": 30, "ignore_eos": True},
                {"prompt": "batch-mate", "max_new_tokens": 30, "stream": False, "ignore_eos": True},
            ],
        )
    assert streamed.status == 200
    assert_streamed_while_generating(streamed, ends[-1])  # failed mid-stream: error in-band as the last line
    assert streamed.lines[-1]["error"]["type"] == "server_error"
    assert whole.status == 500
    assert "injected failure" in json.loads(whole.final)["error"]["message"]
    (after,) = batch(served, [{"prompt": "still here?", "max_new_tokens": 5, "stream": False}])
    assert after.status == 200


def test_bad_config_fails_initialize_naming_the_key(tiny_model_dir):
    handler = Inf2StreamingHandler()
    try:
        cause = load_failure(handler, make_context(model_yaml(tiny_model_dir, max_new_token=5), str(tiny_model_dir)))
        assert re.match(r"ConfigError: .*handler\.max_new_token: unknown key", cause), cause
        handler.shutdown()
        cause = load_failure(handler, make_context(model_yaml(tiny_model_dir / "missing"), str(tiny_model_dir)))
        assert re.match(r"ConfigError: .*model_checkpoint_dir", cause), cause
    finally:
        handler.shutdown()
