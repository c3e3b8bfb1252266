"""Issue 45, prompt-lookup speculation on the hf backend and the tiny model: with k = 1..5 proposed
tokens a row, every sequence's tokens are exactly those of one token a step, for every kind of row
(greedy, seeded sampling with temperature, top-k and top-p, repetition, presence and frequency
penalties, logit_bias, min_tokens, logprobs, JSON-schema and regex grammars), every kind really took
proposals (several tokens in one step), and max_tokens and stop strings cut where they did before. One
step can hold a row without a proposal beside one that takes all 5 of its own."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.engine.ngram import NgramProposer
from handler.engine.sequence import Sequence
from handler.engine.speculation import Speculator
from handler.engine.step_engine import StepEngine
from handler.request import Constraint, GenerationRequest, SamplingParams
from tests.support.engine_runs import RowTaken, run_to_end, watching_decode_calls

N_SLOTS = 4
# Copy-heavy prompts: text the output can repeat (and the tiny model's greedy loops repeat themselves).
PROMPTS = (
    "the cat sat on the mat. the cat sat on the mat. the cat sat on",
    "1 2 3 4 5 1 2 3 4 5 1 2 3",
    "Hello world",
)
SCHEMA = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"], "additionalProperties": False}
# Low temperatures: the tiny model's text is noise, and only its near-greedy loops repeat themselves.
SAMPLED = SamplingParams(do_sample=True, temperature=0.05, seed=7)


def requests() -> dict[str, GenerationRequest]:
    cat, digits, _hello = PROMPTS
    return {
        **{f"greedy{i}": GenerationRequest(prompt, 40, ignore_eos=True) for i, prompt in enumerate(PROMPTS)},
        "sampled": GenerationRequest(digits, 32, sampling=SAMPLED, ignore_eos=True),
        "top_k_p": GenerationRequest(
            digits, 32, sampling=SamplingParams(do_sample=True, temperature=0.1, top_k=20, top_p=0.9, seed=3)
        ),
        "sampled_logprobs": GenerationRequest(digits, 24, sampling=SAMPLED, logprobs=2, ignore_eos=True),
        "logprobs": GenerationRequest(digits, 24, logprobs=2, ignore_eos=True),
        "repetition": GenerationRequest(digits, 24, sampling=SamplingParams(repetition_penalty=1.05)),
        "presence": GenerationRequest(
            digits, 24, sampling=SamplingParams(presence_penalty=0.1, frequency_penalty=0.05), ignore_eos=True
        ),
        "bias": GenerationRequest(cat, 24, sampling=SamplingParams(logit_bias=((5, -100.0),)), ignore_eos=True),
        "min_tokens": GenerationRequest(digits, 24, sampling=SamplingParams(min_tokens=20)),
        "json": GenerationRequest(cat, 40, constraint=Constraint("json_schema", json.dumps(SCHEMA))),
        "regex": GenerationRequest(
            cat, 40, sampling=SAMPLED, constraint=Constraint("regex", r"(the cat sat on the mat\. ){1,4}")
        ),
        "cut": GenerationRequest(cat, 13, ignore_eos=True),  # max_tokens mid-proposal
        "stop": GenerationRequest(cat, 40, stop=(" mat",), ignore_eos=True),
    }


@dataclasses.dataclass
class Run:
    sequences: dict[str, Sequence]
    steps: int
    calls: list[list[RowTaken]]  # per decode call, its rows


def run(model_dir: Path, k: int) -> Run:
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(model_dir), cpu_threads=1), model_dir, N_SLOTS, k)
    engine = StepEngine(backend, 10_000, speculator=Speculator(NgramProposer(k, 1, 3), backoff=False) if k else None)
    wanted = requests()
    with watching_decode_calls(backend, engine) as calls:
        sequences = run_to_end(backend, list(wanted.values()), 2_000, engine, ids=list(wanted))
    backend.close()
    return Run(dict(zip(wanted, sequences, strict=True)), engine.steps, calls)


@pytest.fixture(scope="module")
def baseline(tiny_model_dir: Path) -> Run:
    return run(tiny_model_dir, 0)


@pytest.fixture(scope="module")
def k5(tiny_model_dir: Path) -> Run:
    return run(tiny_model_dir, 5)


def same_output(expected: Run, got: Run) -> None:
    for name, before in expected.sequences.items():
        after = got.sequences[name]
        assert before.error is None and after.error is None, (before.error, after.error)
        assert (after.token_ids, after.full_text, after.finish_reason) == (
            before.token_ids,
            before.full_text,
            before.finish_reason,
        ), name


@pytest.mark.parametrize("k", [1, 3])
def test_speculation_gives_every_sequence_exactly_its_tokens_in_fewer_steps(tiny_model_dir, baseline, k: int):
    got = run(tiny_model_dir, k)
    same_output(baseline, got)
    assert got.steps < baseline.steps  # proposals were accepted: several tokens in some steps


def test_every_kind_of_row_takes_proposals_and_keeps_its_tokens(baseline, k5):
    same_output(baseline, k5)
    several = {row.request_id for call in k5.calls for row in call if row.taken > 1}
    assert several == set(requests()), f"never more than one token a step: {set(requests()) - several}"
    assert all(row.taken <= row.proposed + 1 for call in k5.calls for row in call)


def test_one_step_holds_a_row_without_proposal_and_one_taking_all_five(k5):
    assert any(
        any(row.proposed == 0 and row.taken == 1 for row in call)
        and any(row.proposed == 5 and row.taken == 6 for row in call)
        for call in k5.calls
    )


def test_a_row_cancelled_mid_step_ends_there_and_the_others_keep_their_tokens(tiny_model_dir, baseline):
    """A client leaves while a speculative step runs: its row gets at most that step's tokens, its slot
    (and the holes its rejected proposals left in the stacked cache) is freed at the next step, and
    the rows beside it, and a request admitted into its slot afterwards, get their one-at-a-time tokens."""
    wanted = requests()
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1), tiny_model_dir, 2, 3)
    engine = StepEngine(backend, 10_000, speculator=Speculator(NgramProposer(3, 1, 3), backoff=False))
    sequences = {
        name: Sequence(
            wanted[name], backend.encode(wanted[name].prompt), backend.tokenizer, backend.eos_token_ids, name
        )
        for name in ("greedy0", "greedy1", "greedy2")
    }
    at_cancel: list[int] = []
    decode_plan = backend.decode_plan

    def leaving_mid_step(rows):
        answer = decode_plan(rows)
        if not at_cancel and len(rows) == 2 and sequences["greedy1"].completion_tokens >= 6:
            engine.abort("greedy1")  # during the step: applied at the next one
            slot = next(slot for slot, s in engine.scheduler.running() if s.request_id == "greedy1")
            taken = next(got for row, got in zip(rows, answer, strict=True) if row.slot == slot)
            at_cancel.append(sequences["greedy1"].completion_tokens + len(taken))
        return answer

    backend.decode_plan = leaving_mid_step
    engine.submit(sequences["greedy0"])
    engine.submit(sequences["greedy1"])
    for _ in range(2_000):
        engine.step()
        if at_cancel and all(s.request_id != "greedy1" for _, s in engine.scheduler.running()):
            break
    assert at_cancel, "the client never left"
    assert sequences["greedy1"].completion_tokens == at_cancel[0] < 40  # nothing after the step it left in
    engine.submit(sequences["greedy2"])  # into the freed slot, beside greedy0's holey row
    while not (sequences["greedy0"].finished and sequences["greedy2"].finished):
        engine.step()
    backend.close()
    for name in ("greedy0", "greedy2"):
        assert sequences[name].token_ids == baseline.sequences[name].token_ids, name
    assert sequences["greedy1"].token_ids == baseline.sequences["greedy1"].token_ids[: at_cancel[0]]


def test_rejected_proposals_never_let_the_stacked_cache_grow_past_twice_its_longest_row(tiny_model_dir):
    """Every proposal rejected, step after step: each leaves k masked columns (on its batch-mate too,
    padded to it); once they fill half the stacked width the batch is restacked without them, and the
    tokens stay those of one a step."""
    from handler.backends.hf import HOLE_SLACK
    from handler.request import DecodeRow, SlotRequest

    config = HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1)
    prompts = [(3, 17, 42, 9), (5, 6, 7)]
    steps = 150

    def prefilled(k: int) -> HFBackend:
        backend = HFBackend(config, tiny_model_dir, 2, k)
        backend.prefill([SlotRequest(slot, prompt, ignore_eos=True) for slot, prompt in enumerate(prompts)])
        return backend

    plain = prefilled(0)
    expected = [[c.token_id for c in plain.decode([0, 1])] for _ in range(steps)]
    plain.close()

    backend = prefilled(3)
    widths, got = [], []
    for step in range(steps):
        wrong = tuple((expected[step][0] + 1 + i) % backend.vocab_size for i in range(3))  # never the pick
        answer = backend.decode_plan([DecodeRow(0, 4, proposal=wrong), DecodeRow(1, 4)])
        got.append([tokens[0].token_id for tokens in answer])
        assert [len(tokens) for tokens in answer] == [1, 1]
        longest = max(len(prompt) for prompt in prompts) + step + 2
        widths.append(backend._batch.mask.shape[1])
        assert widths[-1] <= 2 * longest + HOLE_SLACK + 4, (step, widths[-1], longest)
    backend.close()
    assert got == expected
    assert any(later < earlier for earlier, later in itertools.pairwise(widths))  # restacked
