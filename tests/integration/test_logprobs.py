"""Logprobs through the real handler (native and OpenAI routes), in both scheduling modes,
checked against the tiny model's own log-softmax computed directly with transformers; token-id
prompts; and the 400s for what cannot be served."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import torch

from handler.inf2_handler import Inf2StreamingHandler
from tests.support.bench import sim_model_yaml
from tests.support.modes import MODES, tiny_model_yaml
from tests.support.torchserve_harness import ContinuousFrontend, make_context, run_batch

N_SLOTS = 2
TOL = 1e-4
PROMPT = "Today the weather is"
COMPLETIONS = {"url_path": "v1/completions"}
CHAT = {"url_path": "v1/chat/completions"}


class Served:
    """serve(bodies, headers) -> [(status, body text)] in either mode."""

    def __init__(self, handler: Inf2StreamingHandler, context: Any, mode: str) -> None:
        self.handler, self.context, self.mode = handler, context, mode

    def serve(self, bodies: list[Any], headers: list[dict] | None = None) -> list[tuple[int, str]]:
        if self.mode == "continuous":
            frontend = ContinuousFrontend(self.handler, self.context, batch_size=2 * N_SLOTS)
            return [(r.status, r.body) for r in frontend.serve(bodies, headers)]
        return [(r.status, "".join(r.chunks) + r.final) for r in run_batch(self.handler, self.context, bodies, headers)]

    def one(self, body: dict[str, Any], headers: dict | None = None) -> tuple[int, str]:
        return self.serve([body], [headers or {}])[0]


@pytest.fixture(scope="module", params=MODES)
def served(request, tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(tiny_model_yaml(tiny_model_dir, request.param, N_SLOTS), str(tiny_model_dir))
    handler.initialize(context)
    yield Served(handler, context, request.param)
    handler.shutdown()


def sse_events(body: str) -> list[dict[str, Any]]:
    events = [line[len("data: ") :] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def merged_legacy(events: list[dict[str, Any]]) -> tuple[str, dict[str, list]]:
    text, merged = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for event in events:
        for choice in event["choices"]:
            text += choice["text"]
            if choice["logprobs"] is not None:
                for key in merged:
                    merged[key] += choice["logprobs"][key]
    return text, merged


# -- values against the model's own log-softmax ----------------------------------------------


def test_echo_logprobs_match_the_models_log_softmax(served, tiny_tokenizer, model_log_softmax):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    body = {"model": "m", "prompt": [ids], "max_tokens": 6, "logprobs": 3, "echo": True, "temperature": 0}
    status, text = served.one(body, COMPLETIONS)
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    lp = choice["logprobs"]
    generated = lp["tokens"][len(ids) :]
    n_gen = json.loads(text)["usage"]["completion_tokens"]
    assert len(lp["token_logprobs"]) == len(ids) + n_gen == len(lp["top_logprobs"]) == len(lp["text_offset"])
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert len(generated) == n_gen

    # the generated ids, re-derived greedily from the model's log-softmax and checked token by token
    all_ids = list(ids)
    full = model_log_softmax(all_ids)
    for j in range(n_gen):
        ref_row = model_log_softmax(all_ids)[-1]
        token = int(ref_row.argmax())
        assert lp["token_logprobs"][len(ids) + j] == pytest.approx(float(ref_row[token]), abs=TOL)
        top = lp["top_logprobs"][len(ids) + j]
        assert max(top.values()) == lp["token_logprobs"][len(ids) + j]  # greedy: the same float is the top
        all_ids.append(token)
    full = model_log_softmax(all_ids)
    for i in range(1, len(ids)):
        expected = float(full[i - 1, ids[i]])
        assert lp["token_logprobs"][i] == pytest.approx(expected, abs=TOL)
        # keyed by text, tokens that decode alike (partial UTF-8 bytes) share one entry: check the best
        # alternative, and that every value is one of the model's top 3 or the prompt token's own
        ref_top = torch.topk(full[i - 1], 3).values.tolist()
        values = lp["top_logprobs"][i].values()
        assert max(values) == pytest.approx(ref_top[0], abs=TOL)
        assert all(any(abs(v - r) < TOL for r in [*ref_top, expected]) for v in values)
    assert choice["text"].startswith(tiny_tokenizer.decode(ids, skip_special_tokens=True))


def test_lm_eval_loglikelihood_request_shape(served, tiny_tokenizer, model_log_softmax):
    """What lm-eval's local-completions sends for loglikelihood: it needs len(prompt) + 1 entries
    and sums token_logprobs[ctxlen:-1]."""
    ids = tiny_tokenizer("The cat sat on the mat")["input_ids"]
    body = {"prompt": [ids], "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}
    status, text = served.one({"model": "m", **body}, COMPLETIONS)
    assert status == 200, text
    lp = json.loads(text)["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1
    full = model_log_softmax(ids)
    ctxlen = 2
    got = sum(lp["token_logprobs"][ctxlen : len(ids)])
    expected = sum(float(full[i - 1, ids[i]]) for i in range(ctxlen, len(ids)))
    assert got == pytest.approx(expected, abs=TOL * len(ids))
    generated_logprob = lp["token_logprobs"][-1]
    assert generated_logprob == pytest.approx(float(full[-1].max()), abs=TOL)
    assert generated_logprob in lp["top_logprobs"][-1].values()


def test_streamed_completion_logprobs_equal_non_streamed(served, tiny_tokenizer):
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 8, "logprobs": 2, "echo": True, "temperature": 0}
    status, whole = served.one(body, COMPLETIONS)
    status_s, streamed = served.one({**body, "stream": True}, COMPLETIONS)
    assert status == status_s == 200
    choice = json.loads(whole)["choices"][0]
    text, merged = merged_legacy(sse_events(streamed))
    assert text == choice["text"] and text.startswith(PROMPT)
    assert merged == choice["logprobs"]
    offsets = merged["text_offset"]
    assert offsets == sorted(offsets) and offsets[0] == 0


def test_completion_logprobs_without_echo(served):
    body = {"model": "m", "prompt": PROMPT, "max_tokens": 5, "logprobs": 0, "temperature": 0, "ignore_eos": True}
    status, text = served.one(body, COMPLETIONS)
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == 5 and all(v is not None and v <= 0 for v in lp["token_logprobs"])
    assert all(len(top) == 1 for top in lp["top_logprobs"])  # logprobs 0: the chosen token only
    assert "".join(lp["tokens"]) == choice["text"] and lp["text_offset"][0] == 0


def test_chat_logprobs_streamed_and_not(served):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
        "ignore_eos": True,
    }
    status, whole = served.one(body, CHAT)
    assert status == 200, whole
    choice = json.loads(whole)["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == 6
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 3
        assert entry["top_logprobs"][0]["logprob"] == entry["logprob"]  # greedy
    status, streamed = served.one({**body, "stream": True}, CHAT)
    streamed_content = []
    for event in sse_events(streamed):
        for c in event["choices"]:
            streamed_content += (c["logprobs"] or {}).get("content", [])
    assert streamed_content == content


def test_native_logprobs_and_prompt_logprobs(served, tiny_tokenizer, model_log_softmax):
    ids = tiny_tokenizer(PROMPT)["input_ids"]
    body = {"prompt": PROMPT, "max_new_tokens": 4, "logprobs": 2, "prompt_logprobs": True, "ignore_eos": True}
    status, text = served.one({**body, "stream": False})
    assert status == 200, text
    out = json.loads(text)
    assert [t["id"] for t in out["prompt_tokens"]] == ids
    assert out["prompt_tokens"][0]["logprob"] is None and out["prompt_tokens"][0]["top_logprobs"] is None
    full = model_log_softmax(ids)
    for i in range(1, len(ids)):
        assert out["prompt_tokens"][i]["logprob"] == pytest.approx(float(full[i - 1, ids[i]]), abs=TOL)
    for i in range(1, len(ids)):
        ref_top = torch.topk(full[i - 1], 2)
        got = [(a["id"], a["logprob"]) for a in out["prompt_tokens"][i]["top_logprobs"]]
        ref_ids = ref_top.indices.tolist()
        top_got = [(t, v) for t, v in got if t in ref_ids]
        assert [t for t, _ in top_got] == ref_ids  # alternatives by id: the model's top 2, in order
        assert [v for _, v in top_got] == pytest.approx(ref_top.values.tolist(), abs=TOL)
    assert len(out["tokens"]) == 4 and all(2 <= len(t["top_logprobs"]) <= 3 for t in out["tokens"])
    status, streamed = served.one({**body, "stream": True})
    lines = [json.loads(line) for line in streamed.splitlines() if line]
    assert lines[0]["prompt_tokens"] == out["prompt_tokens"]
    assert [t for line in lines for t in line.get("tokens", [])] == out["tokens"]


# -- token-id prompts ----------------------------------------------------------------------


def test_token_id_prompt_is_used_as_is(served, tiny_tokenizer):
    ids = tiny_tokenizer(PROMPT, add_special_tokens=False)["input_ids"]  # no BOS: none may be added
    body = {"model": "m", "prompt": ids, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 0}
    status, text = served.one(body, COMPLETIONS)
    assert status == 200, text
    out = json.loads(text)
    assert out["usage"]["prompt_tokens"] == len(ids)
    assert len(out["choices"][0]["logprobs"]["tokens"]) == len(ids) + out["usage"]["completion_tokens"]


# -- what is refused -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"model": "m", "prompt": ["a", "b"]}, COMPLETIONS, "prompt"),
        ({"model": "m", "prompt": [[1, 2], [3]]}, COMPLETIONS, "prompt"),
        ({"model": "m", "prompt": []}, COMPLETIONS, "prompt"),
        ({"model": "m", "prompt": [1, 99999]}, COMPLETIONS, "prompt"),
        ({"model": "m", "prompt": [-1]}, COMPLETIONS, "prompt"),
        ({"model": "m", "prompt": "hi", "logprobs": 6}, COMPLETIONS, "logprobs"),
        ({"model": "m", "prompt": "hi", "logprobs": True}, COMPLETIONS, "logprobs"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, CHAT, "top_logprobs"),
        (
            {"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21},
            CHAT,
            "top_logprobs",
        ),
        ({"prompt": "hi", "logprobs": 21}, {}, "logprobs"),
        ({"prompt": "hi", "prompt_logprobs": "yes"}, {}, "prompt_logprobs"),
    ],
)
def test_bad_logprob_requests_get_400_naming_the_field(served, body, headers, param):
    status, text = served.one(body, headers)
    assert status == 400, text
    assert json.loads(text)["error"]["param"] == param


def test_a_bad_request_beside_a_logprobs_request(served):
    good = {"model": "m", "prompt": PROMPT, "max_tokens": 3, "logprobs": 1, "temperature": 0}
    bad = {"model": "m", "prompt": [1, 10**6], "logprobs": 1}
    (s1, t1), (s2, t2) = served.serve([good, bad], [COMPLETIONS, COMPLETIONS])
    assert (s1, s2) == (200, 400), t2
    assert json.loads(t1)["choices"][0]["logprobs"]["tokens"]


@pytest.fixture(scope="module")
def sim_served(tiny_model_dir):
    handler = Inf2StreamingHandler()
    context = make_context(sim_model_yaml(tiny_model_dir), str(tiny_model_dir))
    handler.initialize(context)
    yield Served(handler, context, "static")
    handler.shutdown()


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"model": "m", "prompt": "hi", "logprobs": 1}, COMPLETIONS, "logprobs"),
        ({"model": "m", "prompt": "hi", "logprobs": 1, "echo": True}, COMPLETIONS, "echo"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": True}, CHAT, "logprobs"),
        ({"prompt": "hi", "logprobs": 0}, {}, "logprobs"),
        ({"prompt": "hi", "echo": True}, {}, "echo"),
    ],
)
def test_sim_refuses_logprobs_naming_the_field(sim_served, body, headers, param):
    status, text = sim_served.one(body, headers)
    assert status == 400, text
    error = json.loads(text)["error"]
    assert error["param"] == param and "sim backend has no logits" in error["message"]


def test_sim_serves_echo_without_logprobs(sim_served):
    status, text = sim_served.one({"model": "m", "prompt": "hi there", "max_tokens": 2, "echo": True}, COMPLETIONS)
    assert status == 200, text
    choice = json.loads(text)["choices"][0]
    assert choice["text"].startswith("hi there") and choice["logprobs"] is None
    assert math.isfinite(len(choice["text"]))
