"""The engine's speculation bookkeeping (handler/engine/speculation.py, StepEngine): a row whose
proposals keep taking nothing backs off 1, 3, 7, then 15 steps, one accepted token resets it, the rows
that ended are forgotten; and every step's record counts the rows that proposed, the tokens proposed
and those taken, for the engine's proposals and for a backend that drafts its own."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from handler.backends.base import Backend
from handler.engine.ngram import NgramProposer
from handler.engine.sequence import Sequence
from handler.engine.speculation import MAX_SKIP, Speculator
from handler.engine.step_engine import StepEngine
from handler.request import DecodeRow, GenerationRequest, SlotRequest, TokenChoice

HISTORY = [1, 2, 3, 1, 2]  # "1 2" repeats: prompt lookup proposes (3, 1, 2)


def proposing_steps(speculator: Speculator, outcomes: list[int], steps: int) -> list[int]:
    """The steps at which row "r" proposed, each proposal taking outcomes[i] tokens (then 0s)."""
    proposed_at, results = [], iter(outcomes)
    for step in range(steps):
        proposal = speculator.propose("r", HISTORY, 3)
        if proposal:
            proposed_at.append(step)
            speculator.observe("r", len(proposal), next(results, 0))
    return proposed_at


def test_a_row_whose_proposals_take_nothing_backs_off_1_3_7_then_15_steps():
    at = proposing_steps(Speculator(NgramProposer(3), backoff=True), [], 60)
    assert at[:6] == [0, 2, 6, 14, 30, 46]  # waits of 1, 3, 7, 15, 15
    assert MAX_SKIP == 15


def test_an_accepted_token_resets_the_back_off():
    at = proposing_steps(Speculator(NgramProposer(3), backoff=True), [0, 0, 1, 0], 12)
    assert at[:5] == [0, 2, 6, 7, 9]  # after the acceptance at 6: no wait, then a wait of 1


def test_without_back_off_every_step_proposes():
    assert proposing_steps(Speculator(NgramProposer(3), backoff=False), [], 10) == list(range(10))


def test_ended_rows_are_forgotten():
    speculator = Speculator(NgramProposer(3), backoff=True)
    speculator.observe("gone", 3, 0)
    speculator.observe("kept", 3, 0)
    speculator.retain(["kept"])
    assert speculator.propose("gone", HISTORY, 3) == (3, 1, 2)
    assert speculator.propose("kept", HISTORY, 3) == ()


class CountingBackend(Backend):
    """Gives each row its proposal's first `accept` tokens and one more (token 7); or, drafting itself
    (`draft_tokens`), `accept` + 1 tokens a row."""

    name = "counting"
    n_positions = 1_000
    eos_token_ids = frozenset({0})

    def __init__(self, tokenizer, accept: int, draft_tokens: int = 0, n_slots: int = 2) -> None:
        self.tokenizer, self.accept, self.n_slots = tokenizer, accept, n_slots
        self.draft_tokens = draft_tokens
        self.tokens_per_step = 1 + max(draft_tokens, 4)
        self.calls: list[list[tuple[int, ...]]] = []  # each decode call's proposals, row by row

    def prefill(self, requests: Seq[SlotRequest]) -> list[TokenChoice]:
        return [TokenChoice(5) for _ in requests]

    def decode_plan(self, rows: Seq[DecodeRow]) -> list[list[TokenChoice]]:
        self.calls.append([row.proposal for row in rows])
        if self.draft_tokens:
            return [[TokenChoice(7)] * min(self.accept + 1, row.max_tokens) for row in rows]
        return [[*map(TokenChoice, row.proposal[: self.accept]), TokenChoice(7)] for row in rows]

    def decode(self, slots: Seq[int]) -> list[TokenChoice]:
        raise AssertionError("decode_plan is overridden")

    def release(self, slot: int) -> None:
        pass


def run_two_rows(tiny_tokenizer, backend: CountingBackend, speculator: Speculator | None):
    engine = StepEngine(backend, 10_000, speculator=speculator)
    prompt = [5, 7, 5, 7, 5, 7, 5]  # prompt lookup keeps proposing 7 5 7 ...
    for name in ("a", "b"):
        request = GenerationRequest("x", 10, ignore_eos=True)
        engine.submit(Sequence(request, prompt, tiny_tokenizer, backend.eos_token_ids, name))
    for _ in range(3):
        engine.step()
    return engine.take_records()


def test_each_step_records_its_proposals_and_what_they_took(tiny_tokenizer):
    backend = CountingBackend(tiny_tokenizer, accept=2)
    records = run_two_rows(tiny_tokenizer, backend, Speculator(NgramProposer(4, min_n=1), backoff=False))
    decode_steps = [r for r in records if r.decoded]
    assert len(decode_steps) == len(backend.calls) == 3
    for record, proposals in zip(decode_steps, backend.calls, strict=True):
        assert all(proposals), proposals  # every row proposed
        assert record.proposing_rows == 2
        assert record.proposed_tokens == sum(len(p) for p in proposals)
        assert record.accepted_tokens == sum(min(2, len(p)) for p in proposals)
        assert record.decoded_tokens == record.accepted_tokens + 2


def test_a_backend_that_drafts_gets_no_proposals_and_its_drafts_are_counted(tiny_tokenizer):
    backend = CountingBackend(tiny_tokenizer, accept=1, draft_tokens=3)
    records = run_two_rows(tiny_tokenizer, backend, Speculator(NgramProposer(4)))
    assert backend.calls and not any(any(call) for call in backend.calls)
    first = next(r for r in records if r.decoded)
    assert (first.proposing_rows, first.proposed_tokens, first.accepted_tokens, first.decoded_tokens) == (2, 6, 2, 4)


def test_without_speculation_nothing_is_proposed_or_counted(tiny_tokenizer):
    backend = CountingBackend(tiny_tokenizer, accept=0)
    records = run_two_rows(tiny_tokenizer, backend, None)
    assert not any(any(call) for call in backend.calls)
    assert all(r.proposed_tokens == r.accepted_tokens == r.proposing_rows == 0 for r in records)
