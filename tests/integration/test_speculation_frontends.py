"""Issue 45 through both frontends (the ASGI app in-process, the real handler under the TorchServe
harness), the tiny model with `scheduler.speculation` (prompt lookup, k = 3) against the same model
without it: greedy completions, streamed and whole, n = 2, stop strings, a JSON-schema constraint and
logprobs, seeded sampling and penalties give the same text either way, a stream's chunks (several
tokens may come in one) join into that text, and both frontends' metrics count the proposals, the
accepted tokens and the tokens per row per step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from handler.frontend.model import ServedModel
from handler.inf2_handler import Inf2StreamingHandler
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process
from tests.support.torchserve_harness import ContinuousFrontend, make_context

PROMPT = "the cat sat on the mat. the cat sat on the mat. the cat sat on"
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
BODIES = {
    "plain": {"max_tokens": 32},
    "n2": {"max_tokens": 16, "n": 2},
    "stop": {"max_tokens": 32, "stop": [" mat"]},
    "json": {
        "max_tokens": 24,
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}},
    },
    "logprobs": {"max_tokens": 12, "logprobs": 2},
    # Seeded sampling and a penalty speculate too, with the very tokens of one at a time (low
    # temperature: the tiny model's text is noise and only its near-greedy loops repeat themselves).
    "sampled": {"max_tokens": 24, "temperature": 0.05, "seed": 11},
    "penalised": {"max_tokens": 24, "presence_penalty": 0.1},
}


def config(model_dir: Path, speculate: bool) -> dict[str, Any]:
    scheduler: dict[str, Any] = {"mode": "continuous", "n_slots": 4}
    if speculate:
        scheduler["speculation"] = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    return {
        "continuousBatching": True,
        "batchSize": 8,
        "maxBatchDelay": 1,
        "jobQueueSize": 16,
        "handler": {"model_checkpoint_dir": str(model_dir), "backend": "hf", "n_positions": 256, "max_new_tokens": 64},
        "scheduler": scheduler,
    }


def body(name: str, stream: bool) -> dict[str, Any]:
    extra = {} if name == "json" else {"ignore_eos": True}
    return {"model": "m", "prompt": PROMPT, "temperature": 0, "stream": stream, **extra, **BODIES[name]}


def texts(reply: str, stream: bool) -> list[str]:
    """Each choice's text, from the whole body or the stream's chunks joined."""
    if not stream:
        return [choice["text"] for choice in sorted(json.loads(reply)["choices"], key=lambda c: c["index"])]
    out: dict[int, str] = {}
    for block in reply.split("\n\n")[:-1]:
        data = block[len("data: ") :]
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                out[choice["index"]] = out.get(choice["index"], "") + choice["text"]
    return [out[i] for i in sorted(out)]


@pytest.fixture(scope="module")
def asgi_pair(tiny_model_dir: Path) -> Iterator[tuple[InProcessFrontend, InProcessFrontend]]:
    with running_in_process(ServedModel(config(tiny_model_dir, False), tiny_model_dir), model_name="m") as plain:
        with running_in_process(ServedModel(config(tiny_model_dir, True), tiny_model_dir), model_name="m") as spec:
            yield plain, spec


@pytest.fixture(scope="module")
def torchserve_pair(tiny_model_dir: Path) -> Iterator[tuple[ContinuousFrontend, ContinuousFrontend]]:
    handlers = []
    frontends = []
    for speculate in (False, True):
        handler = Inf2StreamingHandler()
        context = make_context(config(tiny_model_dir, speculate), str(tiny_model_dir))
        handler.initialize(context)
        handlers.append(handler)
        frontends.append(ContinuousFrontend(handler, context, batch_size=8))
    yield frontends[0], frontends[1]
    for handler in handlers:
        handler.shutdown()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", sorted(BODIES))
def test_asgi_speculation_changes_no_text(asgi_pair, name: str, stream: bool):
    plain, spec = asgi_pair
    answers = []
    for served in (plain, spec):
        response = served.post("/v1/completions", json=body(name, stream))
        assert response.status_code == 200, response.text
        answers.append(texts(response.text, stream))
    assert answers[0] == answers[1] and all(answers[0])


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", sorted(BODIES))
def test_torchserve_speculation_changes_no_text(torchserve_pair, name: str, stream: bool):
    answers = []
    for frontend in torchserve_pair:
        reply = frontend.serve([body(name, stream)], [{"url_path": "v1/completions"}])[0]
        assert reply.status == 200, reply.body
        answers.append(texts(reply.body, stream))
    assert answers[0] == answers[1] and all(answers[0])


def test_the_speculating_engine_took_several_tokens_in_a_step(torchserve_pair):
    """Without this, the tests above could pass with speculation never taking a proposal."""
    _, spec = torchserve_pair
    engine = spec.handler.serving.engine
    before = engine.steps
    reply = spec.serve([body("plain", False)], [{"url_path": "v1/completions"}])[0]
    assert json.loads(reply.body)["usage"]["completion_tokens"] == 32
    assert engine.steps - before < 32


def test_torchserve_metrics_count_proposals_and_acceptances(torchserve_pair):
    _, spec = torchserve_pair
    spec.serve([body("plain", False)], [{"url_path": "v1/completions"}])
    added = spec.context.metrics.added
    proposed = sum(v for name, v in added if name == "llm_spec_proposed_tokens")
    accepted = sum(v for name, v in added if name == "llm_spec_accepted_tokens")
    per_row = [v for name, v in added if name == "llm_decode_tokens_per_row"]
    assert 0 < accepted <= proposed
    assert per_row and max(per_row) > 1 and min(per_row) >= 1


def test_asgi_metrics_count_proposals_and_acceptances(asgi_pair):
    plain, spec = asgi_pair
    for served in (plain, spec):
        assert served.post("/v1/completions", json=body("plain", False)).status_code == 200
    exposed = {family.name: family for family in text_string_to_metric_families(spec.get("/metrics").text)}
    sample = {s.name: s.value for family in exposed.values() for s in family.samples if not s.labels}
    assert 0 < sample["llm_spec_accepted_tokens_total"] <= sample["llm_spec_proposed_tokens_total"]
    assert sample["llm_decode_tokens_per_row_sum"] > sample["llm_decode_tokens_per_row_count"] > 0
    plain_exposed = plain.get("/metrics").text
    assert "llm_spec_proposed_tokens_total 0.0" in plain_exposed  # declared, never counted without speculation
