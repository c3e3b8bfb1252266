"""The slot scheduler on its own (no model, no engine), and against scripts/bench/des.py's
`continuous` policy, the reference model of continuous batching."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from handler.backends.sim_profile import Profile, load_profile
from handler.engine.scheduler import Admission, SlotScheduler
from handler.request import DecodeRow

REPO = Path(__file__).resolve().parents[2]

from scripts.bench.des import Load, Policy, Shape, simulate

PROFILE_7B = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"


def admitted(admissions: list[Admission[str]]) -> list[tuple[int, str]]:
    """(slot, request id) of one schedule() call."""
    return [(a.slot, a.request_id) for a in admissions]


def scheduler(n_slots: int = 2, budget: int = 10_000, *ids: str, prompt: int = 10) -> SlotScheduler[str]:
    s: SlotScheduler[str] = SlotScheduler(n_slots, budget)
    for request_id in ids:
        s.add(request_id, prompt, f"item-{request_id}")
    return s


# -- slots and FIFO ----------------------------------------------------------------------
def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        SlotScheduler(0, 100)
    with pytest.raises(ValueError):
        SlotScheduler(4, 0)


def test_a_fresh_scheduler_is_idle():
    s = scheduler(3)
    assert s.idle and s.occupied == 0 and s.waiting == 0
    assert s.schedule() == [] and s.running() == []
    assert s.idle


def test_waiting_sequences_fill_free_slots_in_arrival_order():
    s = scheduler(2, 10_000, "a", "b", "c")
    assert (s.waiting, s.occupied, s.idle) == (3, 0, False)
    first = s.schedule()
    assert admitted(first) == [(0, "a"), (1, "b")]
    assert [a.item for a in first] == ["item-a", "item-b"]
    assert (s.waiting, s.occupied, s.idle) == (1, 2, False)
    assert s.schedule() == []  # no slot free: c keeps waiting
    assert s.waiting == 1 and s.knows("c") and s.knows("a")


def test_fifo_order_over_many_steps():
    s = scheduler(3, 10_000, *[f"r{i}" for i in range(10)])
    order: list[str] = []
    while not s.idle:
        for a in s.schedule():
            order.append(a.request_id)
        for _, item in s.running():  # every running one ends after one step
            s.finish(item.removeprefix("item-"))
    assert order == [f"r{i}" for i in range(10)]


def test_a_finished_sequence_frees_its_slot_at_once_for_the_next_waiting_one():
    s = scheduler(2, 10_000, "a", "b", "c", "d")
    s.schedule()
    assert s.finish("a") == 0
    assert (s.occupied, s.waiting) == (1, 2)
    assert not s.knows("a")
    assert admitted(s.schedule()) == [(0, "c")]  # only one slot was free: d waits
    assert s.waiting == 1 and s.knows("d")


def test_finish_of_an_unknown_or_waiting_sequence_changes_nothing():
    s = scheduler(1, 10_000, "a", "b")
    s.schedule()
    assert s.finish("nope") is None
    assert s.finish("b") is None  # waiting, not running
    assert (s.occupied, s.waiting) == (1, 1)
    assert s.finish("a") == 0
    assert s.finish("a") is None  # twice: the slot is not freed twice
    assert admitted(s.schedule()) == [(0, "b")]
    assert s.schedule() == []


def test_abort_of_a_running_sequence_frees_its_slot_for_the_next_schedule():
    s = scheduler(2, 10_000, "a", "b", "c")
    s.schedule()
    assert s.abort("b") == (1, "item-b")
    assert (s.occupied, s.waiting) == (1, 1)
    assert not s.knows("b")
    assert admitted(s.schedule()) == [(1, "c")]


def test_abort_of_a_waiting_sequence_never_admits_it():
    s = scheduler(1, 10_000, "a", "b", "c")
    s.schedule()
    assert s.abort("b") == (None, "item-b")
    assert s.waiting == 1 and not s.knows("b")
    s.finish("a")
    assert admitted(s.schedule()) == [(0, "c")]
    s.finish("c")
    assert s.schedule() == [] and s.idle


def test_abort_of_an_unknown_id_is_none_and_changes_nothing():
    s = scheduler(1, 10_000, "a", "b")
    s.schedule()
    assert s.abort("zzz") is None
    assert (s.occupied, s.waiting) == (1, 1)
    s.finish("a")
    assert s.abort("a") is None  # ended already


def test_a_duplicate_id_is_refused_while_it_is_known():
    s = scheduler(1, 10_000, "a", "b")
    with pytest.raises(ValueError):
        s.add("b", 5, "again")  # waiting
    s.schedule()
    with pytest.raises(ValueError):
        s.add("a", 5, "again")  # running
    assert (s.occupied, s.waiting) == (1, 1)
    s.finish("a")
    s.add("a", 5, "item-a2")  # ended: the id may come back
    assert s.knows("a") and s.waiting == 2


def test_the_lowest_free_slot_is_reused_first():
    s = scheduler(4, 10_000, "a", "b", "c", "d")
    assert admitted(s.schedule()) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    s.finish("d")
    s.abort("b")
    s.add("e", 10, "item-e")
    s.add("f", 10, "item-f")
    s.add("g", 10, "item-g")
    assert admitted(s.schedule()) == [(1, "e"), (3, "f")]
    s.finish("a")
    assert admitted(s.schedule()) == [(0, "g")]


def test_running_lists_slots_in_admission_order_not_slot_order():
    s = scheduler(3, 10_000, "a", "b", "c", "d")
    s.schedule()
    s.finish("a")
    s.schedule()  # d into slot 0, admitted last
    assert s.running() == [(1, "item-b"), (2, "item-c"), (0, "item-d")]
    s.abort("c")
    assert s.running() == [(1, "item-b"), (0, "item-d")]


# -- the prefill token budget ------------------------------------------------------------
def test_the_first_one_is_admitted_even_over_the_budget():
    s: SlotScheduler[str] = SlotScheduler(4, 100)
    s.add("long", 5000, "L")
    s.add("short", 1, "S")
    assert admitted(s.schedule()) == [(0, "long")]  # alone: the budget is spent
    assert admitted(s.schedule()) == [(1, "short")]


def test_prompts_that_fit_exactly_are_admitted_together():
    s: SlotScheduler[str] = SlotScheduler(8, 100)
    for i, n in enumerate((40, 35, 25, 1)):
        s.add(f"r{i}", n, f"r{i}")
    assert admitted(s.schedule()) == [(0, "r0"), (1, "r1"), (2, "r2")]  # 40 + 35 + 25 == 100
    assert admitted(s.schedule()) == [(3, "r3")]


def test_a_burst_of_long_prompts_is_spread_over_steps():
    s: SlotScheduler[str] = SlotScheduler(8, 1000)
    for i in range(5):
        s.add(f"r{i}", 400, f"r{i}")
    per_step = [admitted(s.schedule()) for _ in range(4)]
    assert per_step == [[(0, "r0"), (1, "r1")], [(2, "r2"), (3, "r3")], [(4, "r4")], []]
    assert s.occupied == 5 and s.waiting == 0


def test_short_prompts_behind_a_long_head_wait_their_turn():
    s: SlotScheduler[str] = SlotScheduler(8, 1000)
    for request_id, n in (("a", 300), ("long", 800), ("s1", 10), ("s2", 10)):
        s.add(request_id, n, request_id)
    assert admitted(s.schedule()) == [(0, "a")]  # 800 > 700 left; s1, s2 do not overtake it
    assert s.waiting == 3
    assert admitted(s.schedule()) == [(1, "long"), (2, "s1"), (3, "s2")]


def test_the_budget_is_per_step_and_slots_still_bound_it():
    s: SlotScheduler[str] = SlotScheduler(2, 1000)
    for i in range(4):
        s.add(f"r{i}", 1, f"r{i}")
    assert admitted(s.schedule()) == [(0, "r0"), (1, "r1")]  # tokens left, slots not
    s.finish("r0")
    s.finish("r1")
    assert admitted(s.schedule()) == [(0, "r2"), (1, "r3")]


# -- the step plan -----------------------------------------------------------------------
def test_the_plan_prefills_the_admissions_then_decodes_every_running_one_new_ones_included():
    s = scheduler(3, 10_000, "a", "b")
    first = s.plan(lambda item: 10)
    assert admitted(list(first.prefill)) == [(0, "a"), (1, "b")]
    assert first.decode == (DecodeRow(0, 1), DecodeRow(1, 1))  # one token a row unless asked for more
    s.add("c", 10, "item-c")
    second = s.plan(lambda item: 10)
    assert admitted(list(second.prefill)) == [(2, "c")]
    assert [row.slot for row in second.decode] == [0, 1, 2]  # admission order, the new one last
    assert all(row.adapter_id is None for row in second.decode)
    assert not second.empty and s.plan(lambda item: 10).prefill == ()


def test_a_row_takes_tokens_per_step_but_never_more_than_it_has_left():
    left = {"item-a": 10, "item-b": 2, "item-c": 1, "item-d": 3}
    s = scheduler(4, 10_000, "a", "b")
    s.schedule()  # a and b run: no prefill token ahead of their rows now
    s.add("c", 10, "item-c")
    s.add("d", 10, "item-d")
    plan = s.plan(left.__getitem__, tokens_per_step=4)
    # a: 4 of its 10; b: its 2; c: admitted with 1 left, its prefill token ends it: no row;
    # d: admitted with 3 left, its prefill takes one, 2 for the decode.
    assert plan.decode == (DecodeRow(0, 4), DecodeRow(1, 2), DecodeRow(3, 2))
    assert admitted(list(plan.prefill)) == [(2, "c"), (3, "d")]
    assert plan.decode_rows({0, 3}) == (DecodeRow(0, 4), DecodeRow(3, 2))  # after the prefill, as the engine asks


def test_an_idle_plan_is_empty_and_bad_plans_are_refused():
    s = scheduler(2)
    assert s.plan(lambda item: 1).empty
    with pytest.raises(ValueError):
        s.plan(lambda item: 1, tokens_per_step=0)
    with pytest.raises(ValueError):
        DecodeRow(0, 0)


# -- oracle: the scheduler drives the same timeline as bench_des's continuous policy ----
@dataclass
class Driven:
    """One scheduler-driven run on the profile's step times."""

    first_token: dict[int, float] = field(default_factory=dict)
    finished: dict[int, float] = field(default_factory=dict)
    arrival: dict[int, float] = field(default_factory=dict)
    admitted_in_step: dict[int, int] = field(default_factory=dict)
    admissions_per_step: list[int] = field(default_factory=list)
    budget_deferrals: int = 0  # steps that left a request waiting with a slot free
    queued: int = 0  # requests that found no slot free and waited at least one step


def drive(
    profile: Profile,
    n_slots: int,
    budget: int,
    timed: list[tuple[float, int, int]] | None = None,
    at_step: dict[int, list[tuple[int, int]]] | None = None,
    make: type[SlotScheduler] = SlotScheduler,
) -> Driven:
    """Serve requests with SlotScheduler, one engine step at a time, as the engine does:
    admit + prefill (one row at a time: sum of prefill_s(1, prompt)), then decode every
    running slot (decode_s(live)). Requests arrive at fixed times (`timed`: arrival,
    prompt, output, in arrival order), or at the start of a given step (`at_step`: step
    -> [(prompt, output)], arriving at that step's start time). A request's first token
    is out when its step's prefills are done; it ends after its output tokens."""
    s: SlotScheduler[int] = make(n_slots, budget)
    out = Driven()
    pending = deque(timed or [])
    by_step = dict(at_step or {})
    left: dict[int, int] = {}
    prompt_of: dict[int, int] = {}
    now, step, n = 0.0, 0, 0

    def arrive(t: float, prompt: int, output: int) -> None:
        nonlocal n
        out.arrival[n], prompt_of[n], left[n] = t, prompt, output
        s.add(f"r{n}", prompt, n)
        n += 1

    def end(i: int) -> None:
        out.finished[i] = now
        assert s.finish(f"r{i}") is not None

    while pending or by_step or not s.idle:
        assert step < 100_000, "the scheduler never drained the trace"
        while pending and pending[0][0] <= now:
            arrive(*pending.popleft())
        for prompt, output in by_step.pop(step, []):
            arrive(now, prompt, output)
        if s.idle:
            if pending:
                now = pending[0][0]
            else:
                step += 1  # nothing runs before the next scripted step
            continue
        had_free = s.occupied < n_slots
        admissions = s.schedule()
        out.admissions_per_step.append(len(admissions))
        if s.waiting and s.occupied < n_slots:
            out.budget_deferrals += 1
        if s.waiting and not had_free:
            out.queued += 1
        if admissions:
            now += sum(profile.prefill_s(1, prompt_of[a.item]) for a in admissions)
            for a in admissions:
                out.first_token[a.item] = now
                out.admitted_in_step[a.item] = step
                left[a.item] -= 1
                if left[a.item] == 0:
                    end(a.item)
        live = s.running()
        if live:
            now += profile.decode_s(len(live))
            for _, i in live:
                left[i] -= 1
                if left[i] == 0:
                    end(i)
        step += 1
    return out


def des(profile: Profile, n_slots: int, budget: int, times: list[float], shape: Shape):
    policy = Policy("continuous", n_slots, prefill_token_budget=budget)
    return simulate(profile, policy, Load("poisson", len(times), times=tuple(times)), shape)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return load_profile(PROFILE_7B)


def test_oracle_step_boundary_arrivals_match_bench_des(profile):
    """Fixed lengths (500-token prompts, 20 tokens out), 8 slots, budget 1024 (two
    prompts a step); arrivals land exactly on step boundaries of the profile's times."""
    prompt, output = 500, 20
    script = {0: [(prompt, output)] * 5, 4: [(prompt, output)] * 4, 9: [(prompt, output)] * 6, 30: [(prompt, output)]}
    script[33] = [(prompt, output)] * 9
    ours = drive(profile, 8, 1024, at_step=script)
    n = sum(len(v) for v in script.values())
    assert len(ours.first_token) == len(ours.finished) == n

    # Hand-checked head of the trace: 5 at step 0 -> 2, 2, 1 (budget); 4 at step 4 -> 2, 1,
    # and the 9th waits for a slot: r0 and r1 make 2 tokens in step 0 and their 20th in
    # step 18, so their slots are free for step 19.
    assert [ours.admitted_in_step[i] for i in range(9)] == [0, 0, 1, 1, 2, 4, 4, 5, 19]
    t1 = 2 * profile.prefill_s(1, prompt)
    assert ours.first_token[0] == ours.first_token[1] == pytest.approx(t1, abs=1e-12)
    t2 = t1 + profile.decode_s(2) + 2 * profile.prefill_s(1, prompt)
    assert ours.first_token[2] == pytest.approx(t2, abs=1e-12)
    assert ours.budget_deferrals > 0 and ours.queued > 0  # the budget and the slots both held requests back

    served = des(profile, 8, 1024, [ours.arrival[i] for i in range(n)], Shape(prompt, output))
    assert len(served) == n
    # Requests arriving together are interchangeable (same lengths): compare as sorted rows.
    theirs = sorted((s.request.arrival, s.first_token, s.finished) for s in served)
    mine = sorted((ours.arrival[i], ours.first_token[i], ours.finished[i]) for i in range(n))
    assert [r[0] for r in mine] == [r[0] for r in theirs]
    assert [r[1] for r in mine] == pytest.approx([r[1] for r in theirs], abs=1e-9)
    assert [r[2] for r in mine] == pytest.approx([r[2] for r in theirs], abs=1e-9)


@pytest.mark.parametrize(
    ("seed", "n_slots", "budget", "prompt", "spread", "output", "load"),
    [
        (0, 8, 1024, 500, 300, 24, 0.9),
        (1, 8, 2048, 128, 0, 64, 1.1),  # saturated: slots free one at a time
        (2, 4, 256, 300, 250, 7, 0.8),
        (3, 8, 700, 200, 150, 1, 1.5),  # one token out: every request ends at its prefill
    ],
)
def test_oracle_poisson_trace_per_request_ttft_matches_bench_des(
    profile, seed, n_slots, budget, prompt, spread, output, load
):
    """bench_des draws the trace (Poisson arrivals near saturation, normal prompt lengths);
    driving SlotScheduler over the same requests gives every request the same first-token
    and end times, so it admits the same requests in the same steps."""
    shape = Shape(prompt, output, prompt_spread=spread, seed=seed)
    # About `load` x what the slots can serve with these lengths.
    per_request_s = profile.prefill_s(1, prompt) + (output - 1) * profile.decode_s(n_slots) / n_slots
    rate = load / per_request_s
    policy = Policy("continuous", n_slots, prefill_token_budget=budget)
    served = simulate(profile, policy, Load("poisson", 300, rate=rate, arrival_seed=seed), shape)
    requests = [(s.request.arrival, s.request.prompt_tokens, s.request.output_tokens) for s in served]
    arrivals = [r[0] for r in requests]
    assert len(set(arrivals)) == len(arrivals)  # one order of arrival: no ties to map

    ours = drive(profile, n_slots, budget, timed=requests)
    assert len(ours.first_token) == len(requests) == len(ours.finished)
    # Not a trivial trace: requests waited for a slot, or the budget held some back.
    assert ours.queued > 0 or ours.budget_deferrals > 0
    if spread:
        assert ours.budget_deferrals > 0 and max(ours.admissions_per_step) > 1
    mine_ttft = [ours.first_token[i] - ours.arrival[i] for i in range(len(requests))]
    assert mine_ttft == pytest.approx([s.ttft for s in served], abs=1e-9)
    assert [ours.finished[i] for i in range(len(requests))] == pytest.approx([s.finished for s in served], abs=1e-9)


def test_oracle_is_sensitive_to_the_scheduling_rule(profile):
    """The comparison can fail: a scheduler that lets short prompts overtake a long head
    (no FIFO under the budget) gives other TTFTs than bench_des on a loaded trace with
    spread (it does overtake there: dozens of times)."""

    class Overtaking(SlotScheduler):
        def schedule(self):
            out = []
            budget = self.prefill_token_budget
            for w in list(self._waiting):
                if not self._free:
                    break
                if out and w.prompt_tokens > budget:
                    continue  # skips the long one, unlike the real scheduler
                self._waiting.remove(w)
                budget -= w.prompt_tokens
                slot = self._free.pop(0)
                self._running[w.request_id] = (slot, w.item)
                out.append(Admission(slot, w.request_id, w.item))
            return out

    shape = Shape(500, 24, prompt_spread=300, seed=0)
    policy = Policy("continuous", 8, prefill_token_budget=1024)
    per_request_s = profile.prefill_s(1, 500) + 23 * profile.decode_s(8) / 8
    served = simulate(profile, policy, Load("poisson", 300, rate=1.5 / per_request_s, arrival_seed=0), shape)
    requests = [(s.request.arrival, s.request.prompt_tokens, s.request.output_tokens) for s in served]
    ours = drive(profile, 8, 1024, timed=requests, make=Overtaking)
    mine_ttft = [ours.first_token[i] - ours.arrival[i] for i in range(len(requests))]
    assert mine_ttft != pytest.approx([s.ttft for s in served], abs=1e-9)


# -- LoRA: at most max_adapters distinct adapters run at once ------------------------------------
def test_a_third_adapter_waits_for_a_place_and_base_rows_pass_it():
    scheduler: SlotScheduler[str] = SlotScheduler(n_slots=8, prefill_token_budget=10_000, max_adapters=2)
    scheduler.add("a1", 4, "a1", "A")
    scheduler.add("b1", 4, "b1", "B")
    scheduler.add("c1", 4, "c1", "C")  # a third adapter: waits
    scheduler.add("a2", 4, "a2", "A")  # A is live, but it may not pass the waiting C (no starvation)
    scheduler.add("base", 4, "base")  # a base row takes no adapter's place: it passes
    assert [a.request_id for a in scheduler.schedule()] == ["a1", "b1", "base"]
    assert scheduler.live_adapters == {"A", "B"}
    rows = [row.adapter_id for row in scheduler.plan(lambda _: 10).decode]
    assert rows == ["A", "B", None]  # each decode row names its adapter
    scheduler.finish("b1")  # B's last row ends: C goes next, then A's second row
    assert [a.request_id for a in scheduler.schedule()] == ["c1", "a2"]
    assert scheduler.live_adapters == {"A", "C"}


def test_without_a_limit_every_adapter_runs_at_once():
    scheduler: SlotScheduler[str] = SlotScheduler(n_slots=4, prefill_token_budget=10_000)
    for name in "ABCD":
        scheduler.add(name, 1, name, name)
    assert [a.request_id for a in scheduler.schedule()] == list("ABCD")
