"""The step engines against a scripted step-level backend: no model, no TorchServe.

`ScriptedBackend` answers every prompt with a fixed token script (the reply text's tokens,
then EOS, then filler), kept per slot, so a slot mix-up shows as wrong text; it records
every call and checks the step contract (a prefill goes to a free slot, every decode call
holds exactly the live slots). `StepEngine` is driven by `step()` by hand unless a test is
about its thread; the real tiny tokenizer detokenizes.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest

from handler import failpoints
from handler.backends.base import Backend
from handler.engine.micro_batch import MicroBatchEngine
from handler.engine.sequence import FinishReason, State
from handler.engine.sequence import Sequence as Seq
from handler.engine.step_engine import StepEngine, StepRecord, Update
from handler.errors import EngineError, InvalidRequest
from handler.request import DecodeRow, GenerationRequest, SlotRequest, SlotRequestError, TokenChoice

EOS = 2


def reply(prompt: str) -> str:
    """What the scripted model answers to `prompt`: distinct for distinct prompts."""
    return f" re {prompt} {len(prompt)}."


# A failure rule: (call kind, [(prompt, tokens the slot produced so far)]) -> message to raise, or None.
FailRule = Callable[[str, list[tuple[str, int]]], "str | None"]


@dataclass
class _Slot:
    prompt: str
    script: list[int]
    produced: int = 0


class ScriptedBackend(Backend):
    name = "scripted"
    n_positions = 4096
    eos_token_ids = frozenset({EOS})

    def __init__(self, tokenizer, n_slots: int = 4, fail: FailRule | None = None, fail_call: int | None = None):
        self.tokenizer = tokenizer
        self.n_slots = n_slots
        self.fail = fail
        self.fail_call = fail_call  # index among prefill/decode calls that raises
        self.filler = tokenizer("x", add_special_tokens=False)["input_ids"][0]
        self.live: dict[int, _Slot] = {}
        self.calls: list[tuple] = []  # ("prefill", slots, prompts) | ("decode", slots) | ("release", slot)
        self.violations: list[str] = []
        self.failed_prompts: set[str] = set()  # every prompt in a call that raised
        self.model_calls = 0
        self.now = 0.0  # a fake clock the engine may read; advanced by each call
        self.prefill_cost = 0.0
        self.decode_cost = 0.0

    def script(self, prompt: str) -> list[int]:
        return [*self.tokenizer(reply(prompt), add_special_tokens=False)["input_ids"], EOS]

    def token(self, slot: _Slot) -> int:
        return slot.script[slot.produced] if slot.produced < len(slot.script) else self.filler

    def _maybe_fail(self, kind: str, rows: list[tuple[str, int]]) -> None:
        index, self.model_calls = self.model_calls, self.model_calls + 1
        message = "scripted failure" if index == self.fail_call else (self.fail and self.fail(kind, rows))
        if message:
            self.failed_prompts.update(p for p, _ in rows)
            raise RuntimeError(message)

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        prompts = tuple(self.tokenizer.decode(r.prompt_ids) for r in requests)
        self.calls.append(("prefill", tuple(r.slot for r in requests), prompts))
        self.now += self.prefill_cost
        for r in requests:
            if r.slot in self.live or not 0 <= r.slot < self.n_slots:
                self.violations.append(f"prefill into slot {r.slot}, live or out of range")
        if len({r.slot for r in requests}) != len(requests):
            self.violations.append(f"prefill twice into one slot: {[r.slot for r in requests]}")
        self._maybe_fail("prefill", [(p, 0) for p in prompts])
        out = []
        for r, prompt in zip(requests, prompts, strict=True):
            slot = self.live[r.slot] = _Slot(prompt, self.script(prompt))
            out.append(TokenChoice(self.token(slot)))
            slot.produced += 1
        return out

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        self.calls.append(("decode", tuple(slots)))
        self.now += self.decode_cost
        if sorted(slots) != sorted(self.live) or len(set(slots)) != len(slots):
            self.violations.append(f"decode {list(slots)} but live slots are {sorted(self.live)}")
        self._maybe_fail("decode", [(self.live[s].prompt, self.live[s].produced) for s in slots if s in self.live])
        out = []
        for s in slots:
            slot = self.live[s]
            out.append(TokenChoice(self.token(slot)))
            slot.produced += 1
        return out

    def release(self, slot: int) -> None:
        self.calls.append(("release", slot))
        self.live.pop(slot, None)

    # -- what the tests read -------------------------------------------------------------
    def prefilled_prompts(self) -> list[str]:
        return [p for c in self.calls if c[0] == "prefill" for p in c[2]]

    def slot_of(self, prompt: str) -> int | None:
        return next((s for s, slot in self.live.items() if slot.prompt == prompt), None)


def make_seq(tokenizer, prompt: str, request_id: str | None = None, max_new_tokens: int = 64, **kwargs) -> Seq:
    request = GenerationRequest(prompt=prompt, max_new_tokens=max_new_tokens, **kwargs)
    ids = tokenizer(prompt)["input_ids"]
    return Seq(request, ids, tokenizer, frozenset({EOS}), request_id=request_id or prompt)


def engine_for(backend: ScriptedBackend, budget: int = 10_000) -> StepEngine:
    return StepEngine(backend, budget, clock=lambda: backend.now)


def step_calls(engine: StepEngine, backend: ScriptedBackend) -> list[tuple]:
    """Run one step by hand; the backend calls it made."""
    before = len(backend.calls)
    engine.step()
    return backend.calls[before:]


@dataclass
class Log:
    """Everything `take` returned, per request."""

    text: dict[str, str] = field(default_factory=dict)
    ended: dict[str, Update] = field(default_factory=dict)
    after_end: list[str] = field(default_factory=list)  # ids take returned again after their end

    def take(self, engine: StepEngine, ids) -> dict[str, Update]:
        updates = engine.take(ids)
        for request_id, update in updates.items():
            if request_id in self.ended:
                self.after_end.append(request_id)
            self.text[request_id] = self.text.get(request_id, "") + update.text
            if update.ended:
                self.ended[request_id] = update
        return updates


def run_until_idle(engine: StepEngine, log: Log, ids, max_steps: int = 10_000) -> int:
    steps = 0
    while not engine.scheduler.idle:
        engine.step()
        log.take(engine, ids)
        steps += 1
        assert steps < max_steps, "the engine never went idle"
    return steps


def solo(tokenizer, prompt: str, **kwargs) -> tuple[str, FinishReason | None, int]:
    """The request alone on a fresh engine: (text, finish reason, tokens)."""
    backend = ScriptedBackend(tokenizer, n_slots=1)
    engine = engine_for(backend)
    seq = make_seq(tokenizer, prompt, **kwargs)
    engine.submit(seq)
    log = Log()
    run_until_idle(engine, log, [seq.request_id])
    assert not backend.violations and not backend.live
    return log.text[seq.request_id], seq.finish_reason, seq.completion_tokens


def decode_slots(calls: list[tuple]) -> list[tuple[int, ...]]:
    return [c[1] for c in calls if c[0] == "decode"]


# -- StepEngine, stepped by hand ---------------------------------------------------------
def test_a_request_alone_gets_its_script_as_text(tiny_tokenizer):
    text, reason, tokens = solo(tiny_tokenizer, "hello world")
    assert text == reply("hello world")
    assert reason is FinishReason.EOS
    assert tokens == len(tiny_tokenizer(reply("hello world"), add_special_tokens=False)["input_ids"]) + 1


def test_a_request_joining_mid_decode_gets_exactly_its_solo_tokens(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=5)
    engine = engine_for(backend)
    first = [make_seq(tiny_tokenizer, p) for p in ("the first one", "a second, longer prompt here")]
    for s in first:
        engine.submit(s)
    log = Log()
    ids = ["the first one", "a second, longer prompt here", "late comer", "capped", "one token"]
    for _ in range(3):
        engine.step()
        log.take(engine, ids)
    assert all(s.completion_tokens == 4 and not s.finished for s in first)  # mid-decode
    engine.submit(make_seq(tiny_tokenizer, "late comer"))
    engine.submit(make_seq(tiny_tokenizer, "capped", max_new_tokens=5))
    engine.submit(make_seq(tiny_tokenizer, "one token", max_new_tokens=1))
    joined = step_calls(engine, backend)
    log.take(engine, ids)
    assert joined[0][0] == "prefill" and joined[0][2] == ("late comer", "capped", "one token")
    run_until_idle(engine, log, ids)

    assert not backend.violations and not backend.live
    for prompt, kwargs in [(p, {}) for p in ids[:3]] + [("capped", {"max_new_tokens": 5})]:
        text, reason, tokens = solo(tiny_tokenizer, prompt, **kwargs)
        assert log.text[prompt] == text and log.ended[prompt].sequence.full_text == text
        assert log.ended[prompt].sequence.finish_reason is reason
        assert log.ended[prompt].sequence.completion_tokens == tokens
    assert log.ended["capped"].sequence.finish_reason is FinishReason.LENGTH
    assert log.ended["one token"].sequence.completion_tokens == 1
    assert log.ended["one token"].sequence.finish_reason is FinishReason.LENGTH


def test_every_decode_call_holds_every_live_slot_the_new_ones_included(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=3)
    engine = engine_for(backend)
    prompts = ["aa", "bbbbbbbbbbbbbbbb", "c", "dddddddd", "ee ee ee", "f"]
    for i, p in enumerate(prompts):
        engine.submit(make_seq(tiny_tokenizer, p, max_new_tokens=3 + 2 * i))
    log = Log()
    steps = 0
    while not engine.scheduler.idle:
        running_before = {slot for slot, _ in engine.scheduler.running()}
        calls = step_calls(engine, backend)
        log.take(engine, prompts)
        steps += 1
        prefilled = {slot for c in calls if c[0] == "prefill" for slot in c[1]}
        # No request ends at its first token here: every step decodes, the new rows included.
        assert [set(d) for d in decode_slots(calls)] == [running_before | prefilled], calls
    assert not backend.violations, backend.violations
    assert steps > len(prompts)  # rows joined and left over many steps
    assert set(log.ended) == set(prompts)


def test_a_finished_slot_is_released_and_reused_by_a_waiting_one_next_step(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = engine_for(backend)
    engine.submit(make_seq(tiny_tokenizer, "short", max_new_tokens=2))
    engine.submit(make_seq(tiny_tokenizer, "long one"))
    engine.submit(make_seq(tiny_tokenizer, "waiting"))
    assert step_calls(engine, backend) == [
        ("prefill", (0, 1), ("short", "long one")),
        ("decode", (0, 1)),
        ("release", 0),  # "short" made its 2 tokens: slot 0 is free at once
    ]
    assert (engine.occupied, engine.waiting) == (1, 1)
    assert step_calls(engine, backend) == [("prefill", (0,), ("waiting",)), ("decode", (1, 0))]
    assert not backend.violations


def test_aborting_a_running_request_frees_its_slot_within_one_step(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = engine_for(backend)
    for p in ("victim", "survivor", "next in line"):
        engine.submit(make_seq(tiny_tokenizer, p))
    engine.step()
    log = Log()
    log.take(engine, ["victim"])
    victim = log.text["victim"]
    engine.abort("victim")
    calls = step_calls(engine, backend)
    # Released before the waiting one is prefilled into the same slot, in the same step.
    assert calls == [("release", 0), ("prefill", (0,), ("next in line",)), ("decode", (1, 0))]
    assert backend.slot_of("victim") is None
    assert engine.take(["victim"]) == {}  # forgotten: nothing more is sent for it
    engine.abort("victim")  # twice: harmless
    engine.abort("never seen")
    run_until_idle(engine, log, ["victim", "survivor", "next in line"])
    assert log.text["victim"] == victim and "victim" not in log.ended
    assert set(log.ended) == {"survivor", "next in line"}
    assert not backend.violations and not backend.live and engine.occupied == 0


def test_aborting_a_waiting_request_never_prefills_it(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=1)
    engine = engine_for(backend)
    for p in ("running", "doomed", "after"):
        engine.submit(make_seq(tiny_tokenizer, p))
    engine.step()
    engine.abort("doomed")
    engine.step()
    assert not engine.scheduler.knows("doomed") and engine.waiting == 1
    log = Log()
    run_until_idle(engine, log, ["running", "doomed", "after"])
    assert "doomed" not in backend.prefilled_prompts()
    assert backend.prefilled_prompts() == ["running", "after"]
    assert set(log.ended) == {"running", "after"} and "doomed" not in log.text
    engine.submit(make_seq(tiny_tokenizer, "doomed"))  # the id is free again


def test_a_prefill_failure_fails_only_the_admitted_ones(tiny_tokenizer):
    def boom(kind, rows):
        return "prefill boom" if kind == "prefill" and any("boom" in p for p, _ in rows) else None

    backend = ScriptedBackend(tiny_tokenizer, n_slots=4, fail=boom)
    engine = engine_for(backend)
    engine.submit(make_seq(tiny_tokenizer, "steady"))
    engine.step()
    engine.step()
    engine.submit(make_seq(tiny_tokenizer, "boom here"))
    engine.submit(make_seq(tiny_tokenizer, "same step"))
    log = Log()
    ids = ["steady", "boom here", "same step", "later"]
    calls = step_calls(engine, backend)
    log.take(engine, ids)
    assert calls[0] == ("prefill", (1, 2), ("boom here", "same step"))
    assert ("release", 1) in calls and ("release", 2) in calls
    assert ("decode", (0,)) in calls  # the running one went on in the same step
    for request_id in ("boom here", "same step"):
        update = log.ended[request_id]
        assert update.sequence.state is State.FAILED and update.text == ""
        assert isinstance(update.sequence.error, EngineError) and "prefill boom" in update.sequence.error.message
    engine.submit(make_seq(tiny_tokenizer, "later"))
    run_until_idle(engine, log, ids)
    assert log.text["steady"] == solo(tiny_tokenizer, "steady")[0]
    assert log.text["later"] == solo(tiny_tokenizer, "later")[0]
    assert log.ended["steady"].sequence.error is None and log.ended["later"].sequence.error is None
    assert not backend.violations and not backend.live


class OneBadRequestBackend(ScriptedBackend):
    """Refuses the request whose prompt says "bad grammar" as the sampler refuses a constraint that
    does not compile: a SlotRequestError naming its slot, after the whole call's forward."""

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        out = super().prefill(requests)
        for r in requests:
            if "bad grammar" in self.tokenizer.decode(r.prompt_ids):
                raise SlotRequestError(r.slot, "the constraint cannot be enforced: no")
        return out


def test_a_request_the_backend_refuses_fails_alone_and_its_call_mates_are_prefilled_again(tiny_tokenizer):
    backend = OneBadRequestBackend(tiny_tokenizer, n_slots=4)
    engine = engine_for(backend)
    ids = ["first", "bad grammar", "third"]
    for prompt in ids:
        engine.submit(make_seq(tiny_tokenizer, prompt))
    log = Log()
    run_until_idle(engine, log, ids)
    prefills = [c for c in backend.calls if c[0] == "prefill"]
    assert prefills[0][2] == ("first", "bad grammar", "third") and prefills[1][2] == ("first", "third")
    bad = log.ended["bad grammar"].sequence
    assert (
        isinstance(bad.error, InvalidRequest) and bad.error.status == 400 and "cannot be enforced" in bad.error.message
    )
    for prompt in ("first", "third"):
        assert log.text[prompt] == solo(tiny_tokenizer, prompt)[0] and log.ended[prompt].sequence.error is None
    assert not backend.violations and not backend.live


def test_a_decode_failure_fails_that_steps_sequences_and_the_engine_serves_on(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4, fail_call=3)  # prefill, decode, decode, [decode]
    engine = engine_for(backend)
    ids = ["one", "two", "three"]
    engine.submit(make_seq(tiny_tokenizer, "one"))
    engine.submit(make_seq(tiny_tokenizer, "two"))
    log = Log()
    for _ in range(2):
        engine.step()
        log.take(engine, ids)
    sent = dict(log.text)
    calls = step_calls(engine, backend)
    log.take(engine, ids)
    assert calls == [("decode", (0, 1)), ("release", 0), ("release", 1)]
    for request_id in ("one", "two"):
        sequence = log.ended[request_id].sequence
        assert sequence.state is State.FAILED and "scripted failure" in sequence.error.message
        assert sequence.completion_tokens == 3  # prefill + 2 decodes, nothing from the failed call
        assert log.text[request_id] == sent[request_id] and sent[request_id]  # what was sent stays sent
    assert engine.occupied == 0 and not backend.live
    engine.submit(make_seq(tiny_tokenizer, "three"))
    run_until_idle(engine, log, ids)
    assert log.text["three"] == solo(tiny_tokenizer, "three")[0]
    assert log.ended["three"].sequence.finish_reason is FinishReason.EOS
    assert not backend.violations


def test_the_failpoint_fails_a_decode_after_its_token_count(tiny_tokenizer, monkeypatch):
    monkeypatch.setenv(failpoints.ENV_VAR, "FAILME")
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4)
    engine = engine_for(backend)
    ids = ["please FAILME now", "bystander", "after"]
    engine.submit(make_seq(tiny_tokenizer, "please FAILME now"))
    engine.submit(make_seq(tiny_tokenizer, "bystander"))
    log = Log()
    while "please FAILME now" not in log.ended:
        engine.step()
        log.take(engine, ids)
    marked = log.ended["please FAILME now"].sequence
    assert marked.state is State.FAILED and failpoints.ENV_VAR in marked.error.message
    assert marked.completion_tokens == failpoints.FAIL_AFTER_TOKENS
    # The backend never saw the failing call: prefill + FAIL_AFTER_TOKENS - 1 decodes.
    assert len(decode_slots(backend.calls)) == failpoints.FAIL_AFTER_TOKENS - 1
    assert log.ended["bystander"].sequence.state is State.FAILED  # same decode step
    assert not backend.live
    engine.submit(make_seq(tiny_tokenizer, "after"))
    run_until_idle(engine, log, ids)
    assert log.ended["after"].sequence.finish_reason is FinishReason.EOS
    assert log.text["after"] == reply("after")


def test_take_returns_the_text_since_the_last_take_and_forgets_ended_requests(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = engine_for(backend)
    engine.submit(make_seq(tiny_tokenizer, "talker"))
    engine.submit(make_seq(tiny_tokenizer, "quiet"))
    assert engine.take(["talker", "quiet", "nobody"]) == {}  # no news before a step
    for _ in range(3):
        engine.step()
    first = engine.take(["talker"])
    assert set(first) == {"talker"} and not first["talker"].ended
    assert first["talker"].sequence.request_id == "talker"
    text_so_far = first["talker"].text
    assert text_so_far and text_so_far == "".join(first["talker"].sequence.text)  # 3 steps' deltas joined
    assert engine.take(["talker"]) == {}  # nothing new since
    engine.step()
    parts = [text_so_far]
    while True:
        updates = engine.take(["talker"])
        if updates:
            parts.append(updates["talker"].text)
            if updates["talker"].ended:
                break
        engine.step()
    assert "".join(parts) == reply("talker")
    assert engine.take(["talker"]) == {}  # forgotten once its end was taken
    engine.submit(make_seq(tiny_tokenizer, "talker"))  # so the id may be used again
    while not engine.scheduler.idle:
        engine.step()
    late = engine.take(["quiet"])  # never taken: everything at once, with the end
    assert late["quiet"].ended and late["quiet"].text == reply("quiet")
    assert engine.take(["quiet"]) == {}
    with pytest.raises(ValueError):
        engine.submit(make_seq(tiny_tokenizer, "talker"))  # ended but not taken: still known


def test_the_prefill_token_budget_spreads_admissions_over_steps(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=8)
    prompts = ["alpha beta gamma", "delta epsilon zeta", "eta theta iota", "kappa lambda mu", "nu xi omicron pi"]
    lengths = [len(tiny_tokenizer(p)["input_ids"]) for p in prompts]
    budget = lengths[0] + lengths[1]  # two prompts a step at most
    assert lengths[2] + lengths[3] <= budget < lengths[2] + lengths[3] + lengths[4]
    engine = engine_for(backend, budget)
    for p in prompts:
        engine.submit(make_seq(tiny_tokenizer, p))
    per_step = []
    for _ in range(4):
        calls = step_calls(engine, backend)
        per_step.append([c[2] for c in calls if c[0] == "prefill"])
    assert per_step == [[tuple(prompts[:2])], [tuple(prompts[2:4])], [(prompts[4],)], []]
    assert not backend.violations

    # The first in line goes however long it is; the short ones behind it wait.
    backend = ScriptedBackend(tiny_tokenizer, n_slots=8)
    engine = engine_for(backend, 4)
    engine.submit(make_seq(tiny_tokenizer, "a long prompt well over four tokens"))
    engine.submit(make_seq(tiny_tokenizer, "b"))
    assert [c[2] for c in step_calls(engine, backend) if c[0] == "prefill"] == [
        ("a long prompt well over four tokens",)
    ]
    assert [c[2] for c in step_calls(engine, backend) if c[0] == "prefill"] == [("b",)]


def test_step_records_after_steps(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    backend.prefill_cost, backend.decode_cost = 0.5, 0.25
    engine = engine_for(backend)
    assert engine.step() is False  # nothing to do: no record, no step counted
    assert engine.take_records() == [] and engine.steps == 0
    engine.submit(make_seq(tiny_tokenizer, "a", max_new_tokens=3))
    engine.submit(make_seq(tiny_tokenizer, "b", max_new_tokens=1))
    engine.submit(make_seq(tiny_tokenizer, "c", max_new_tokens=2))
    engine.step()  # a, b prefilled; b ends at its first token; a decoded
    engine.step()  # c joins b's slot; a ends (3 tokens); c decoded and ends (2 tokens)
    assert engine.steps == 2
    assert engine.take_records() == [
        StepRecord(prefill_s=0.5, decode_s=0.25, prefilled=2, decoded=1, occupied=1, waiting=1, decoded_tokens=1),
        StepRecord(prefill_s=0.5, decode_s=0.25, prefilled=1, decoded=2, occupied=0, waiting=0, decoded_tokens=2),
    ]
    assert engine.take_records() == []
    engine.submit(make_seq(tiny_tokenizer, "d", max_new_tokens=1))
    engine.submit(make_seq(tiny_tokenizer, "e", max_new_tokens=3))
    engine.step()
    engine.abort("e")
    engine.step()  # only the abort: no record
    engine.submit(make_seq(tiny_tokenizer, "f", max_new_tokens=3))
    engine.step()
    engine.step()  # decode only
    assert engine.take_records() == [
        StepRecord(prefill_s=0.5, decode_s=0.25, prefilled=2, decoded=1, occupied=1, waiting=0, decoded_tokens=1),
        StepRecord(prefill_s=0.5, decode_s=0.25, prefilled=1, decoded=1, occupied=1, waiting=0, decoded_tokens=1),
        StepRecord(prefill_s=None, decode_s=0.25, prefilled=0, decoded=1, occupied=0, waiting=0, decoded_tokens=1),
    ]
    assert engine.steps == 5


def test_submitting_an_id_twice_is_refused(tiny_tokenizer):
    engine = engine_for(ScriptedBackend(tiny_tokenizer))
    engine.submit(make_seq(tiny_tokenizer, "same"))
    with pytest.raises(ValueError):
        engine.submit(make_seq(tiny_tokenizer, "same"))
    assert engine.waiting == 1


# -- no slot leaks -----------------------------------------------------------------------
WORDS = "apple pear plum fig kiwi lime date grape melon berry cherry mango peach lemon".split()


def expected_solo(tokenizer, backend: ScriptedBackend, sequence: Seq) -> tuple[str, FinishReason | None]:
    """The request's own script fed to a fresh Sequence: what it must get, batched or not."""
    fresh = Seq(sequence.request, list(sequence.prompt_ids), tokenizer, frozenset({EOS}))
    slot = _Slot(sequence.request.prompt, backend.script(sequence.request.prompt))
    text = []
    while not fresh.finished:
        text.append(fresh.take(TokenChoice(backend.token(slot))))
        slot.produced += 1
    return "".join(text), fresh.finish_reason


def test_no_slot_leaks_under_random_arrivals_aborts_and_failures(tiny_tokenizer):
    rng = random.Random(1234)

    def failures(kind, rows):
        if kind == "prefill" and any("boom" in p for p, _ in rows):
            return "prefill boom"
        if kind == "decode" and any("crash" in p and n >= 3 for p, n in rows):
            return "decode crash"
        return None

    backend = ScriptedBackend(tiny_tokenizer, n_slots=6, fail=failures)
    engine = engine_for(backend, budget=24)
    sequences: dict[str, Seq] = {}
    aborted_waiting: set[str] = set()
    aborted_running: set[str] = set()
    log = Log()
    to_submit = 200
    steps = 0
    while to_submit or not engine.scheduler.idle:
        for _ in range(min(to_submit, rng.choice((0, 0, 0, 1, 1, 2, 3)))):
            i = 200 - to_submit
            to_submit -= 1
            words = rng.sample(WORDS, rng.randint(1, 5))
            marker = rng.random()
            words += ["boom"] if marker < 0.03 else ["crash"] if marker < 0.06 else []
            prompt = f"r{i} " + " ".join(words)
            s = make_seq(tiny_tokenizer, prompt, request_id=f"r{i}", max_new_tokens=rng.randint(1, 24))
            sequences[s.request_id] = s
            engine.submit(s)
        if rng.random() < 0.12:  # abort one, running or waiting (a coin decides which)
            running = [s.request_id for _, s in engine.scheduler.running()]
            waiting = [r for r in sequences if engine.scheduler.knows(r) and r not in running]
            pool, kind = (running, aborted_running) if rng.random() < 0.5 else (waiting, aborted_waiting)
            if pool:
                victim = rng.choice(pool)
                kind.add(victim)
                engine.abort(victim)
        engine.step()
        steps += 1
        assert steps < 20_000
        for victim in aborted_running:  # freed within one step
            assert backend.slot_of(sequences[victim].request.prompt) is None
        log.take(engine, list(sequences))

    assert len(sequences) == 200
    assert aborted_waiting and aborted_running, "the trace must abort both kinds"
    assert backend.failed_prompts, "the trace must hit backend failures"
    assert engine.scheduler.occupied == 0 and engine.scheduler.waiting == 0 and engine.scheduler.idle
    assert backend.live == {}
    assert not backend.violations, backend.violations[:5]
    assert not log.after_end
    assert engine.take(list(sequences)) == {}
    prefilled = set(backend.prefilled_prompts())
    for request_id in aborted_waiting:
        assert sequences[request_id].request.prompt not in prefilled
    failed = finished = 0
    for request_id, s in sequences.items():
        if request_id in aborted_waiting or request_id in aborted_running:
            continue
        update = log.ended[request_id]  # every other request ended and its end was taken
        assert update.sequence is s and s.finished
        if s.request.prompt in backend.failed_prompts:
            assert s.state is State.FAILED and isinstance(s.error, EngineError) and s.finish_reason is None
            failed += 1
        else:
            assert s.error is None and s.state is State.FINISHED
            text, reason = expected_solo(tiny_tokenizer, backend, s)
            assert (log.text.get(request_id, ""), s.finish_reason) == (text, reason), request_id
            finished += 1
    assert failed and finished > 100


# -- several tokens a step: the step plan --------------------------------------------------
class MultiTokenScriptedBackend(ScriptedBackend):
    """Gives each decode row its `max_tokens` next tokens of its script a step (up to k, its
    `tokens_per_step`), as a backend that speculates would; `answer` may rewrite a step's lists
    (a broken backend)."""

    def __init__(self, tokenizer, k: int, n_slots: int = 4, answer=None):
        super().__init__(tokenizer, n_slots)
        self.tokens_per_step = k
        self.answer = answer
        self.plans: list[tuple[DecodeRow, ...]] = []
        self.engine: StepEngine | None = None  # set: each row's budget is checked against its sequence

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        self.plans.append(tuple(rows))
        slots = [row.slot for row in rows]
        self.calls.append(("decode", tuple(slots)))
        if sorted(slots) != sorted(self.live):
            self.violations.append(f"decode {slots} but live slots are {sorted(self.live)}")
        running = dict(self.engine.scheduler.running()) if self.engine else {}
        out = []
        for row in rows:
            if row.slot in running and row.max_tokens != min(self.tokens_per_step, running[row.slot].tokens_left):
                self.violations.append(f"slot {row.slot} may take {row.max_tokens}, not what it has left")
            slot = self.live[row.slot]
            tokens = []
            for _ in range(row.max_tokens):
                tokens.append(TokenChoice(self.token(slot)))
                slot.produced += 1
            out.append(tokens)
        return self.answer(rows, out) if self.answer else out


def many_requests(tokenizer) -> list[tuple[str, dict]]:
    """Requests that end every way: EOS, length (cut inside a step), stop strings, stop token ids."""
    stop_token = tokenizer(" re", add_special_tokens=False)["input_ids"][-1]
    return [
        ("hello world", {}),
        ("capped", {"max_new_tokens": 5}),
        ("one token", {"max_new_tokens": 1}),
        ("two tokens", {"max_new_tokens": 2}),
        ("stopped early", {"stop": (reply("stopped early")[4:7],)}),
        ("stop across", {"stop": (reply("stop across")[-4:-1],)}),
        ("stop token", {"stop_token_ids": (stop_token,)}),
        ("never stops", {"stop": ("zzz",), "max_new_tokens": 9}),
    ]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_several_tokens_a_step_give_each_request_its_one_token_a_step_output(tiny_tokenizer, k):
    backend = MultiTokenScriptedBackend(tiny_tokenizer, k, n_slots=3)
    engine = backend.engine = engine_for(backend)
    requests = many_requests(tiny_tokenizer)
    for prompt, kwargs in requests:
        engine.submit(make_seq(tiny_tokenizer, prompt, **kwargs))
    log = Log()
    ids = [prompt for prompt, _ in requests]
    run_until_idle(engine, log, ids)
    assert not backend.violations and not backend.live
    for prompt, kwargs in requests:
        text, reason, tokens = solo(tiny_tokenizer, prompt, **kwargs)
        got = log.ended[prompt].sequence
        assert (log.text[prompt], got.full_text) == (text, text)
        assert (got.finish_reason, got.completion_tokens) == (reason, tokens)
    rows = [row for plan in backend.plans for row in plan]
    assert max(row.max_tokens for row in rows) == k  # the backend gave every row all it could take
    records = engine.take_records()
    assert sum(r.decoded_tokens for r in records) == sum(row.max_tokens for row in rows)
    assert sum(r.decoded for r in records) == len(rows)


def test_a_rows_budget_is_what_it_has_left_after_its_prefill_token(tiny_tokenizer):
    backend = MultiTokenScriptedBackend(tiny_tokenizer, 4, n_slots=2)
    engine = engine_for(backend)
    engine.submit(make_seq(tiny_tokenizer, "long", max_new_tokens=40))
    engine.submit(make_seq(tiny_tokenizer, "six", max_new_tokens=6, ignore_eos=True))
    engine.step()  # both prefilled (1 token each), then decoded: 4 and 4 (5 left)
    engine.step()  # "six" has 1 left
    assert [[(r.slot, r.max_tokens) for r in plan] for plan in backend.plans] == [[(0, 4), (1, 4)], [(0, 4), (1, 1)]]
    assert engine.take(["six"])["six"].sequence.completion_tokens == 6


@pytest.mark.parametrize("bad", [[], "too many"])
def test_a_row_answered_with_no_tokens_or_too_many_fails_alone(tiny_tokenizer, bad):
    def answer(rows, out):
        victim = rows.index(next(r for r in rows if r.slot == 1))
        out[victim] = [] if bad == [] else out[victim] * 2
        return out

    backend = MultiTokenScriptedBackend(tiny_tokenizer, 2, n_slots=3, answer=answer)
    engine = engine_for(backend)
    ids = ["first", "victim", "third"]
    for prompt in ids:
        engine.submit(make_seq(tiny_tokenizer, prompt))
    log = Log()
    engine.step()
    log.take(engine, ids)
    victim = log.ended["victim"].sequence
    assert victim.state is State.FAILED and isinstance(victim.error, EngineError)
    assert "gave slot 1" in victim.error.message and "not 1 to 2" in victim.error.message
    assert victim.completion_tokens == 1  # its prefill token; nothing of the refused answer
    assert ("release", 1) in backend.calls and "first" not in log.ended and "third" not in log.ended
    backend.answer = None
    run_until_idle(engine, log, ids)
    for prompt in ("first", "third"):
        assert log.text[prompt] == solo(tiny_tokenizer, prompt)[0]


def test_a_decode_answer_with_the_wrong_number_of_rows_fails_the_call(tiny_tokenizer):
    backend = MultiTokenScriptedBackend(tiny_tokenizer, 2, n_slots=2, answer=lambda rows, out: out[:1])
    engine = engine_for(backend)
    engine.submit(make_seq(tiny_tokenizer, "a"))
    engine.submit(make_seq(tiny_tokenizer, "b"))
    log = Log()
    engine.step()
    log.take(engine, ["a", "b"])
    for prompt in ("a", "b"):
        sequence = log.ended[prompt].sequence
        assert sequence.state is State.FAILED and "answered 1 rows for 2 decode rows" in sequence.error.message
    assert not backend.live


def test_the_default_decode_plan_is_decode_one_token_a_row_and_serves_no_adapter(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    backend.prefill([SlotRequest(0, (5, 6)), SlotRequest(1, (7,))])
    assert backend.tokens_per_step == 1
    tokens = backend.decode_plan([DecodeRow(1), DecodeRow(0)])
    assert [len(t) for t in tokens] == [1, 1] and backend.calls[-1] == ("decode", (1, 0))
    with pytest.raises(SlotRequestError) as refused:
        backend.decode_plan([DecodeRow(0), DecodeRow(1, adapter_id="french")])
    assert refused.value.slot == 1 and refused.value.param == "model" and "no adapters" in str(refused.value)


# -- StepEngine on its own thread --------------------------------------------------------
def test_the_engine_thread_serves_requests_until_stopped(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = StepEngine(backend, 10_000)
    engine.start()
    try:
        prompts = ["thread one", "thread two", "thread three", "thread four"]
        for p in prompts:
            engine.submit(make_seq(tiny_tokenizer, p))
        log = Log()
        for _ in range(10_000):
            pending = [p for p in prompts if p not in log.ended]
            if not pending:
                break
            engine.wait(pending, engine.steps, timeout_s=5.0)
            log.take(engine, pending)
        assert set(log.ended) == set(prompts)
        for p in prompts:
            assert log.text[p] == reply(p) and log.ended[p].sequence.finish_reason is FinishReason.EOS
    finally:
        engine.stop()
    assert engine._thread is not None and not engine._thread.is_alive()
    assert not backend.violations and not backend.live and engine.occupied == 0


def test_wait_returns_after_a_step_even_without_news(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=1)
    engine = StepEngine(backend, 10_000, clock=lambda: 0.0)  # frozen: wait can only end on news or a step
    engine.start()
    try:
        # A long request keeps the engine stepping; the waited-for id never has news.
        engine.submit(make_seq(tiny_tokenizer, "busy", max_new_tokens=100_000, ignore_eos=True))
        before = engine.steps
        waiter = threading.Thread(target=engine.wait, args=(["ghost"], before, 3600.0), daemon=True)
        waiter.start()
        waiter.join(timeout=60)  # a liveness guard, not a timing check
        assert not waiter.is_alive(), "wait() did not return after a step"
        assert engine.steps > before
        assert engine.take(["ghost"]) == {}
        engine.abort("busy")
    finally:
        engine.stop()
    assert engine._thread is not None and not engine._thread.is_alive()


def test_stop_returns_on_an_idle_engine(tiny_tokenizer):
    engine = StepEngine(ScriptedBackend(tiny_tokenizer), 10_000)
    engine.start()
    engine.stop()
    assert engine._thread is not None and not engine._thread.is_alive()


def test_on_idle_fires_once_each_time_the_engine_empties(tiny_tokenizer):
    """The handler re-reports its slot gauges through this hook: a client that leaves while
    nothing else is in flight gets no further frontend call to report them."""
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = engine_for(backend)
    fired: list[tuple[int, int]] = []
    engine.on_idle = lambda: fired.append((engine.occupied, engine.waiting))
    for p in ("stays", "leaves", "waits"):
        engine.submit(make_seq(tiny_tokenizer, p))
    engine.step()
    engine.abort("leaves")
    run_until_idle(engine, Log(), ["stays", "leaves", "waits"])
    assert fired == [(0, 0)]
    engine.step()  # an idle step: no second report
    assert fired == [(0, 0)]
    engine.submit(make_seq(tiny_tokenizer, "alone", max_new_tokens=1000, ignore_eos=True))
    engine.step()
    assert fired == [(0, 0)]
    engine.abort("alone")
    engine.step()  # applies the abort: idle again
    assert fired == [(0, 0), (0, 0)]


# -- MicroBatchEngine --------------------------------------------------------------------
def run_micro(backend, sequences, on_finished=None) -> dict[str, str]:
    sent: dict[str, str] = {s.request_id: "" for s in sequences}

    def on_text(s, delta):
        sent[s.request_id] += delta

    MicroBatchEngine(backend).run(sequences, on_text, on_finished)
    return sent


def test_a_micro_batch_runs_to_its_end(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4)
    seqs = [make_seq(tiny_tokenizer, p) for p in ("first of three", "second", "third, the longest of them")]
    sent = run_micro(backend, seqs)
    for s in seqs:
        assert sent[s.request_id] == reply(s.request.prompt) == s.full_text
        assert s.finish_reason is FinishReason.EOS
    assert backend.calls[0] == ("prefill", (0, 1, 2), tuple(s.request.prompt for s in seqs))
    assert sorted(c[1] for c in backend.calls if c[0] == "release") == [0, 1, 2]  # each once
    assert not backend.violations and not backend.live


def test_on_finished_fires_as_each_sequence_ends_while_the_others_go_on(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4)
    seqs = [
        make_seq(tiny_tokenizer, "long runner"),
        make_seq(tiny_tokenizer, "capped", max_new_tokens=2),
        make_seq(tiny_tokenizer, "at once", max_new_tokens=1),
    ]
    finished: list[tuple[str, int, int]] = []  # (who, the long one's tokens then, backend calls then)

    def on_finished(s):
        finished.append((s.request_id, seqs[0].completion_tokens, len(backend.calls)))

    sent = run_micro(backend, seqs, on_finished)
    assert [(who, tokens) for who, tokens, _ in finished] == [
        ("at once", 1),
        ("capped", 2),
        ("long runner", seqs[0].completion_tokens),
    ]
    assert seqs[0].completion_tokens > 2 and sent["long runner"] == reply("long runner")
    # Ended rows leave the batch: later decode calls do not hold their slots.
    assert decode_slots(backend.calls)[:2] == [(0, 1), (0,)]
    assert not backend.violations and not backend.live


@pytest.mark.parametrize("fail_call", [0, 2])  # the prefill, a decode
def test_a_backend_failure_fails_the_whole_micro_batch_and_releases_its_slots(tiny_tokenizer, fail_call):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4, fail_call=fail_call)
    seqs = [make_seq(tiny_tokenizer, p) for p in ("one of two", "two of two")]
    finished: list[str] = []
    sent = run_micro(backend, seqs, lambda s: finished.append(s.request_id))
    for s in seqs:
        assert s.state is State.FAILED and isinstance(s.error, EngineError)
        assert "scripted failure" in s.error.message
        assert s.completion_tokens == fail_call  # the prefill's token + decodes before the failing one
        assert bool(sent[s.request_id]) == (fail_call > 0)
    assert finished == []
    assert sorted(c[1] for c in backend.calls if c[0] == "release") == [0, 1]
    assert not backend.live and not backend.violations


def test_a_failure_after_one_sequence_finished_leaves_it_finished(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2, fail_call=3)
    seqs = [make_seq(tiny_tokenizer, "done early", max_new_tokens=2), make_seq(tiny_tokenizer, "caught out")]
    run_micro(backend, seqs)
    assert seqs[0].state is State.FINISHED and seqs[0].finish_reason is FinishReason.LENGTH
    assert seqs[1].state is State.FAILED
    assert sorted(c[1] for c in backend.calls if c[0] == "release") == [0, 1]
    assert not backend.live and not backend.violations


def test_the_failpoint_fails_a_micro_batch(tiny_tokenizer, monkeypatch):
    monkeypatch.setenv(failpoints.ENV_VAR, "FAILME")
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    seqs = [make_seq(tiny_tokenizer, "FAILME please"), make_seq(tiny_tokenizer, "neighbour")]
    run_micro(backend, seqs)
    assert all(s.state is State.FAILED for s in seqs)
    assert seqs[0].completion_tokens == failpoints.FAIL_AFTER_TOKENS
    assert not backend.live


def test_more_sequences_than_slots_is_refused(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    seqs = [make_seq(tiny_tokenizer, p) for p in ("a", "b", "c")]
    with pytest.raises(ValueError):
        run_micro(backend, seqs)
    assert backend.calls == [] and all(s.state is State.RUNNING for s in seqs)
    run_micro(backend, [])  # an empty batch does nothing
    assert backend.calls == []


# -- holding a step for the caller's admissions -------------------------------------------
def test_the_next_step_is_held_for_the_caller_only_where_it_is_worth_it(tiny_tokenizer):
    """A step is held for the caller's admissions only with a slot free for a newcomer, in the few
    steps after a slot was freed, with other streams to share it, until the caller comes, and not
    once the caller is seen to come later than the hold would last (a share of the last step)."""
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4)
    backend.decode_cost = 1.0
    engine = StepEngine(backend, 10_000, clock=lambda: backend.now, admission_wait=0.1)
    for prompt in ("long one", "long two"):
        engine.submit(make_seq(tiny_tokenizer, prompt, max_new_tokens=50, ignore_eos=True))
    engine.submit(make_seq(tiny_tokenizer, "short", max_new_tokens=2, ignore_eos=True))
    assert not engine.holds_next_step()  # no step yet: nothing to size a hold by
    engine.step()  # "short" ends: its slot is free
    assert engine.occupied == 2 and engine.holds_next_step()
    backend.now += 0.05
    engine.admissions_done()  # 50 ms after the step: within 10 % of a 1 s step
    assert not engine.holds_next_step()  # it came
    engine.step()
    engine.step()
    assert engine.holds_next_step()  # the third step after the slot was freed
    engine.submit(make_seq(tiny_tokenizer, "waiting a", max_new_tokens=50, ignore_eos=True))
    engine.submit(make_seq(tiny_tokenizer, "waiting b", max_new_tokens=50, ignore_eos=True))
    assert not engine.holds_next_step()  # the waiting ones take the free slots: no room for a newcomer
    engine.abort("waiting a")
    engine.abort("waiting b")
    engine.step()
    assert not engine.holds_next_step()  # four steps since: no newcomer is likely now
    engine.abort("long two")
    engine.step()  # the abort frees a slot
    backend.now += 0.9
    engine.admissions_done()  # far later than the hold would last: the average gap is now above it
    engine.submit(make_seq(tiny_tokenizer, "long three", max_new_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.occupied == 2 and not engine.holds_next_step()
    assert not backend.violations
    lone = StepEngine(ScriptedBackend(tiny_tokenizer, n_slots=2), 10_000, admission_wait=0.5)
    lone.submit(make_seq(tiny_tokenizer, "alone", max_new_tokens=50, ignore_eos=True))
    lone.submit(make_seq(tiny_tokenizer, "brief", max_new_tokens=2, ignore_eos=True))
    lone.step()
    assert lone.occupied == 1 and not lone.holds_next_step()  # nobody else would wait for the call
    never = StepEngine(ScriptedBackend(tiny_tokenizer, n_slots=3), 10_000, admission_wait=0.0)
    for prompt in ("one", "two"):
        never.submit(make_seq(tiny_tokenizer, prompt, max_new_tokens=50, ignore_eos=True))
    never.submit(make_seq(tiny_tokenizer, "brief", max_new_tokens=2, ignore_eos=True))
    never.step()
    assert not never.holds_next_step()
