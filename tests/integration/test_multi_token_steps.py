"""Several tokens per row per step through the real engine and the real tiny model: the same
requests served k = 2, 3, 4 tokens a step (tests/support/multi_token.py over the hf backend)
give exactly what they give one token a step (k = 1): text, token ids, finish reason, logprobs,
usage. The StepEngine is driven by hand (submit, step, take), every case's requests together in
one batch of 4 slots.

Cases that need a place in the output (a stop string across two tokens of one step, a stop token
id) find it in the request's own output one token a step first, so they hold for whatever the
random tiny model says."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine
from handler.request import Constraint, GenerationRequest, SamplingParams
from tests.support.multi_token import MultiTokenBackend

N_SLOTS = 4
KS = (2, 3, 4)
SAMPLED = SamplingParams(do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234)
SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"enum": ["x", "yy"]}},
    "required": ["a", "b"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFBackend:
    config = HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1)
    return HFBackend(config, tiny_model_dir, N_SLOTS)


@dataclass(frozen=True)
class Want:
    """One sequence of a case: its id, request and output index (OpenAI `n`)."""

    request_id: str
    request: GenerationRequest
    choice_index: int = 0


@dataclass(frozen=True)
class Outcome:
    """What the client of one sequence gets."""

    streamed: str  # every `take` delta, joined
    text: str
    token_ids: tuple[int, ...]
    state: str
    finish_reason: str | None
    error: str | None
    completion_tokens: int
    logprob_count: int
    top_logprob_counts: tuple[int, ...]
    prompt_logprob_count: int


@dataclass
class Served:
    outcomes: dict[str, Outcome]
    logprobs: dict[str, list[float | None]]
    backend: MultiTokenBackend
    engine: StepEngine


def serve(hf: HFBackend, wants: list[Want], k: int) -> Served:
    backend = MultiTokenBackend(hf, k)
    engine = StepEngine(backend, prefill_token_budget=10_000)
    sequences = {}
    for want in wants:
        ids = hf.encode(want.request.prompt)
        sequence = Sequence(
            want.request, ids, hf.tokenizer, hf.eos_token_ids, want.request_id, choice_index=want.choice_index
        )
        sequences[want.request_id] = sequence
        engine.submit(sequence)
    streamed = dict.fromkeys(sequences, "")
    for _ in range(10_000):
        if engine.scheduler.idle:
            break
        engine.step()
        for request_id, update in engine.take(list(sequences)).items():
            streamed[request_id] += update.text
    assert engine.scheduler.idle
    outcomes, logprobs = {}, {}
    for request_id, s in sequences.items():
        outcomes[request_id] = Outcome(
            streamed[request_id],
            s.full_text,
            tuple(s.token_ids),
            s.state.value,
            None if s.finish_reason is None else str(s.finish_reason),
            None if s.error is None else s.error.message,
            s.completion_tokens,
            len(s.choices),
            tuple(len(c.top_logprobs) for c in s.choices),
            len(s.prompt_logprobs),
        )
        logprobs[request_id] = [c.logprob for c in s.choices]
    return Served(outcomes, logprobs, backend, engine)


def alone(hf: HFBackend, request: GenerationRequest) -> Sequence:
    """The request served alone, one token a step: where its output has what a case needs."""
    backend = MultiTokenBackend(hf, 1)
    engine = StepEngine(backend, prefill_token_budget=10_000)
    sequence = Sequence(request, hf.encode(request.prompt), hf.tokenizer, hf.eos_token_ids, "probe")
    engine.submit(sequence)
    while not engine.scheduler.idle:
        engine.step()
    return sequence


def one_step(first: int, last: int, k: int) -> bool:
    """Tokens first..last (0-based; token 0 is the prefill's) come in one decode step of k tokens
    while the row has more left than that: decode step j gives tokens 1 + j*k .. (j+1)*k."""
    return first >= 1 and (first - 1) // k == (last - 1) // k


def same_step_for_every_k(i: int) -> bool:
    """Tokens i and i+1 come in one decode step for every k in KS."""
    return all(one_step(i, i + 1, k) for k in KS)


# -- the cases -----------------------------------------------------------------------------
Case = Callable[[HFBackend], list[Want]]


def plain_greedy(hf: HFBackend) -> list[Want]:
    return [Want("greedy", GenerationRequest("Once upon a time", 32))]


def two_token_stop(hf: HFBackend) -> tuple[GenerationRequest, int]:
    """A request with a two-character stop string: the last character of token i's text and the
    first of token i+1's, both in one decode step for every k, and token i+2 in that step too for
    some k (the tokens after the stop, given and dropped). (The request, i.)"""
    base = GenerationRequest("Serving many users at once", 48, ignore_eos=True)
    deltas = alone(hf, base).text
    for i in range(1, len(deltas) - 2):
        stop = deltas[i][-1:] + deltas[i + 1][:1]
        at = len("".join(deltas[: i + 1])) - 1  # where the stop must first occur: across the two tokens
        if len(stop) == 2 and "".join(deltas).find(stop) == at and same_step_for_every_k(i):
            if any(one_step(i, i + 2, k) for k in KS):
                return GenerationRequest(base.prompt, 48, stop=(stop, "never in the text"), ignore_eos=True), i
    raise AssertionError(f"no two-token stop string in {deltas}")


def stop_string_across_two_tokens_of_one_step(hf: HFBackend) -> list[Want]:
    return [Want("stop across", two_token_stop(hf)[0])]


def stop_string_in_one_token(hf: HFBackend) -> list[Want]:
    deltas = alone(hf, GenerationRequest("The weather today", 30, ignore_eos=True)).text
    stop = next(d for d in deltas[3:] if len(d) >= 2)
    return [Want("stop", GenerationRequest("The weather today", 30, stop=(stop,), ignore_eos=True))]


def max_new_tokens_cut_inside_a_step(hf: HFBackend) -> list[Want]:
    return [Want(f"cut {n}", GenerationRequest("Counting: one two", n, ignore_eos=True)) for n in (1, 2, 6, 7)]


def eos(hf: HFBackend) -> list[Want]:
    """EOS comes as the 4th token (min_tokens holds it back until then; a bias forces it)."""
    (eos_id,) = sorted(hf.eos_token_ids)[:1]
    sampling = SamplingParams(min_tokens=3, logit_bias=((eos_id, 100.0),))
    return [Want("eos", GenerationRequest("Hi", 20, sampling=sampling))]


def stop_token_ids(hf: HFBackend) -> list[Want]:
    ids = alone(hf, GenerationRequest("A list of fruit", 30, ignore_eos=True)).token_ids
    at = next(i for i in range(2, len(ids)) if same_step_for_every_k(i) and ids[i] not in ids[:i])
    return [Want("stop id", GenerationRequest("A list of fruit", 30, stop_token_ids=(ids[at],), ignore_eos=True))]


def logprobs_with_top_logprobs(hf: HFBackend) -> list[Want]:
    return [
        Want("logprobs", GenerationRequest("Tell me a story", 20, logprobs=3, prompt_logprobs=True)),
        Want("sampled logprobs", GenerationRequest("Tell me a story", 20, sampling=SAMPLED, logprobs=2)),
    ]


def grammar(hf: HFBackend) -> list[Want]:
    regex = Constraint("regex", r"[a-z]{2,6}( [a-z]{2,6}){1,3}\.")
    return [
        Want("regex", GenerationRequest("The answer is", 40, constraint=regex, logprobs=1)),
        Want("json", GenerationRequest("JSON:", 48, constraint=Constraint("json_schema", json.dumps(SCHEMA)))),
    ]


def seeded_sampling(hf: HFBackend) -> list[Want]:
    return [Want("seeded", GenerationRequest("In the beginning", 24, sampling=SAMPLED))]


def several_outputs_of_one_request(hf: HFBackend) -> list[Want]:
    """OpenAI `n` = 3: output i samples with seed + i, all in one batch."""
    return [
        Want(f"n{i}", GenerationRequest("Pick a colour", 16, sampling=SamplingParams(do_sample=True, seed=7 + i)), i)
        for i in range(3)
    ]


def penalties(hf: HFBackend) -> list[Want]:
    sampling = SamplingParams(repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3)
    return [Want("penalties", GenerationRequest("Once upon a time", 24, sampling=sampling))]


CASES: dict[str, Case] = {
    "greedy": plain_greedy,
    "stop string across two tokens of one step": stop_string_across_two_tokens_of_one_step,
    "stop string in one token": stop_string_in_one_token,
    "max_new_tokens cut inside a step": max_new_tokens_cut_inside_a_step,
    "eos": eos,
    "stop_token_ids": stop_token_ids,
    "logprobs with top_logprobs": logprobs_with_top_logprobs,
    "grammar": grammar,
    "seeded sampling": seeded_sampling,
    "n outputs in one batch": several_outputs_of_one_request,
    "penalties": penalties,
}


def assert_same_as_one_token_a_step(hf: HFBackend, wants: list[Want]) -> dict[int, Served]:
    served = {k: serve(hf, wants, k) for k in (1, *KS)}
    base = served[1]
    assert all(len(step) and max(step) == 1 for step in base.backend.steps)
    for k in KS:
        got = served[k]
        assert got.outcomes == base.outcomes, f"k={k}"
        for request_id, logprobs in base.logprobs.items():
            assert got.logprobs[request_id] == pytest.approx(logprobs, abs=1e-4), f"k={k} {request_id}"
        decoded = sum(r.decoded_tokens for r in got.engine.take_records())
        assert decoded == sum(sum(step) for step in got.backend.steps)
    for outcome in base.outcomes.values():
        assert outcome.streamed == outcome.text
    return served


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_k_tokens_a_step_serve_what_one_token_a_step_serves(hf, case):
    wants = CASES[case](hf)
    served = assert_same_as_one_token_a_step(hf, wants)
    if any(o.completion_tokens > 2 for o in served[1].outcomes.values()):
        assert max(max(step) for step in served[4].backend.steps) > 1  # rows did get several tokens a step


def test_every_case_together_in_one_batch_of_four_slots(hf):
    """More sequences than slots: they join and leave between steps of several tokens."""
    wants = [want for case in CASES.values() for want in case(hf)]
    assert len(wants) > 3 * N_SLOTS
    assert_same_as_one_token_a_step(hf, wants)


def test_the_tokens_after_a_stop_in_one_step_are_not_counted(hf):
    """The stop string completes at token i+1 of a step that gave i+2 too (k >= 3): the sequence
    counts only the tokens up to the stop, the backend gave it more."""
    request, i = two_token_stop(hf)
    served = assert_same_as_one_token_a_step(hf, [Want("stop", request)])
    outcome = served[1].outcomes["stop"]
    assert (outcome.finish_reason, outcome.completion_tokens) == ("stop", i + 2)
    prompt = tuple(hf.encode(request.prompt))
    for k in KS:
        ((given_prompt, given),) = served[k].backend.given
        assert given_prompt == prompt
        assert given > outcome.completion_tokens if one_step(i, i + 2, k) else given == outcome.completion_tokens


def test_the_eos_case_ends_inside_a_step(hf):
    (want,) = eos(hf)
    served = assert_same_as_one_token_a_step(hf, [want])
    outcome = served[1].outcomes["eos"]
    assert (outcome.finish_reason, outcome.completion_tokens) == ("eos", 4)
    assert served[4].backend.steps == [[3]]  # tokens 1..3 in one step, the 3rd EOS
