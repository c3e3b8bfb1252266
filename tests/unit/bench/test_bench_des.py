"""The discrete-event policy reference: hand-checkable traces, not timings."""

import json

import pytest

from handler.backends.sim_profile import load_profile
from scripts.bench.des import (
    Load,
    Policy,
    Shape,
    capacity,
    main,
    reference,
    run,
    saturated_rate,
    scaled,
    simulate,
)
from scripts.bench.stats import arrival_offsets
from tests.support.bench import PROFILE_7B

CONT = Policy("continuous", 8)
IDEAL = Policy("ideal", 8)
STATIC = Policy("static", 8, max_batch_delay_s=0.02)


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE_7B)


def at(*times: float) -> Load:
    return Load("poisson", len(times), times=tuple(times))


def ttfts(profile, policy, load, prompt=100, output=16):
    return [s.ttft for s in simulate(profile, policy, load, Shape(prompt, output))]


# -- continuous (as built) ---------------------------------------------------------------
def test_a_lone_request_prefills_at_once(profile):
    pf = profile.prefill_s(1, 100)
    assert ttfts(profile, CONT, at(0.0)) == pytest.approx([pf])
    assert ttfts(profile, IDEAL, at(0.0)) == pytest.approx([pf])
    assert ttfts(profile, STATIC, at(0.0)) == pytest.approx([0.02 + pf])  # the batch delay first


def test_rows_joining_together_are_prefilled_one_at_a_time_and_answer_together(profile):
    pf1 = profile.prefill_s(1, 100)
    two = Policy("continuous", 2)
    assert ttfts(profile, two, at(0.0, 0.0)) == pytest.approx([2 * pf1, 2 * pf1])
    # the batched context kernel of the ideal policy: one prefill of two rows
    assert ttfts(profile, Policy("ideal", 2), at(0.0, 0.0)) == pytest.approx([profile.prefill_s(2, 100)] * 2)
    assert profile.prefill_s(2, 100) < 2 * pf1


def test_the_step_decodes_every_live_row_and_a_join_stalls_the_others(profile):
    pf, d1, d2 = profile.prefill_s(1, 100), profile.decode_s(1), profile.decode_s(2)
    a, b = simulate(profile, Policy("continuous", 2), at(0.0, 0.001), Shape(100, 3))
    # A: prefill, decode(1); B arrived during A's prefill, joins the next step: prefill B,
    # then decode both rows (B's first decode included)
    assert a.first_token == pytest.approx(pf)
    assert b.first_token == pytest.approx(pf + d1 + pf)
    assert a.finished == pytest.approx(pf + d1 + pf + d2)
    assert b.finished == pytest.approx(pf + d1 + pf + d2 + d1)  # A ended: B decodes alone


def test_the_budget_splits_admission_over_steps(profile):
    pf, d2 = profile.prefill_s(1, 100), profile.decode_s(2)
    policy = Policy("continuous", 8, prefill_token_budget=250)
    got = ttfts(profile, policy, at(0.0, 0.0, 0.0))
    assert got == pytest.approx([2 * pf, 2 * pf, 2 * pf + d2 + pf])  # 100 + 100 fit, + 100 does not


def test_a_prompt_over_the_budget_still_gets_a_step_of_its_own(profile):
    pf300 = profile.prefill_s(1, 300)
    got = ttfts(profile, Policy("continuous", 8, prefill_token_budget=250), at(0.0, 0.0), prompt=300)
    assert got == pytest.approx([pf300, pf300 + profile.decode_s(1) + pf300])


def test_a_finished_request_frees_its_slot_for_the_next_step(profile):
    pf, d1 = profile.prefill_s(1, 100), profile.decode_s(1)
    one = Policy("continuous", 1)
    first, second = simulate(profile, one, at(0.0, 0.0), Shape(100, 3))
    assert first.finished == pytest.approx(pf + 2 * d1)
    assert second.first_token == pytest.approx(pf + 2 * d1 + pf)
    # a one-token request ends at its prefill and is never decoded
    first, second = simulate(profile, one, at(0.0, 0.0), Shape(100, 1))
    assert (first.finished, second.first_token, second.finished) == pytest.approx((pf, 2 * pf, 2 * pf))


def test_more_requests_than_slots_wait_in_fifo_order(profile):
    pf, d2 = profile.prefill_s(1, 100), profile.decode_s(2)
    got = simulate(profile, Policy("continuous", 2), at(0.0, 0.0, 0.0, 0.0), Shape(100, 4))
    round_one = 2 * pf + 3 * d2
    assert [s.ttft for s in got] == pytest.approx([2 * pf, 2 * pf, round_one + 2 * pf, round_one + 2 * pf])


def test_closed_streams_send_the_next_request_when_the_last_ends(profile):
    pf, d2 = profile.prefill_s(1, 100), profile.decode_s(2)
    s = run(profile, Policy("continuous", 2), Load("concurrent", 4, streams=2), Shape(100, 16))
    round_time = 2 * pf + 15 * d2
    assert s.duration_s == pytest.approx(2 * round_time)
    assert s.output_tokens_per_s == pytest.approx(4 * 16 / (2 * round_time))
    assert s.requests_ok == 4 and s.ttft_ms.p50 == pytest.approx(2 * pf * 1000)
    sync = run(profile, CONT, Load("synchronous", 3), Shape(100, 16))
    assert sync.ttft_ms.p50 == pytest.approx(pf * 1000)
    assert sync.itl_ms.p50 == pytest.approx(profile.decode_s(1) * 1000)


def test_capacity_is_the_saturated_continuous_rate(profile):
    shape = Shape(100, 128)
    expected = 1 / (profile.prefill_s(1, 100) + 127 * profile.decode_s(8) / 8)
    assert capacity(profile, shape, 8) == pytest.approx(expected)
    assert capacity(profile, shape, 8) == pytest.approx(4.552, abs=0.001)
    # a budget of one prompt per step refills the slots over several steps: less
    assert capacity(profile, shape, 8, prefill_token_budget=100) < expected
    # ideal batches its prefills: more at saturation, for the same lengths
    batched = 8 / (profile.prefill_s(8, 100) + 127 * profile.decode_s(8))
    assert saturated_rate(profile, IDEAL, shape) == pytest.approx(batched)
    # static prefills row by row, as its engine does, then decodes in lockstep
    per_row = 8 / (8 * profile.prefill_s(1, 100) + 127 * profile.decode_s(8))
    assert saturated_rate(profile, STATIC, shape) == pytest.approx(per_row)


def test_open_loads_use_the_clients_arrival_times(profile):
    load = Load("poisson", 50, rate=3.0)
    assert load.arrival_times() == arrival_offsets("poisson", 3.0, 50, 2)
    served = simulate(profile, CONT, load, Shape(100, 8))
    assert [s.request.arrival for s in served] == pytest.approx(load.arrival_times())
    assert Load("constant", 3, rate=2.0).arrival_times() == [0.0, 0.5, 1.0]


def test_prompt_spread_draws_lengths_around_the_mean(profile):
    served = simulate(profile, CONT, Load("poisson", 400, rate=2.0), Shape(100, 4, prompt_spread=10))
    prompts = [s.request.prompt_tokens for s in served]
    assert 98 < sum(prompts) / len(prompts) < 102 and len(set(prompts)) > 10


# -- static ------------------------------------------------------------------------------
def test_a_full_batch_goes_at_once_and_the_next_waits_for_all_of_it(profile):
    got = ttfts(profile, STATIC, at(*(0.0,) * 9))
    prefills = 8 * profile.prefill_s(1, 100)
    assert got[:8] == pytest.approx([prefills] * 8)  # every first token once all rows are prefilled
    batch = prefills + 15 * profile.decode_s(8)
    assert got[8] == pytest.approx(batch + 0.02 + profile.prefill_s(1, 100))
    # a slot scheduler lets the ninth in as soon as the first eight finish, without the delay
    ideal_batch = profile.prefill_s(8, 100) + 15 * profile.decode_s(8)
    assert ttfts(profile, IDEAL, at(*(0.0,) * 9))[8] == pytest.approx(ideal_batch + profile.prefill_s(1, 100))


def test_static_batch_closes_when_full_before_the_delay(profile):
    got = ttfts(profile, Policy("static", 2, max_batch_delay_s=0.02), at(0.0, 0.005))
    pf2 = 2 * profile.prefill_s(1, 100)
    assert got == pytest.approx([0.005 + pf2, pf2])


def test_static_charges_the_rows_still_live(profile):
    a, b = simulate(profile, Policy("static", 2, max_batch_delay_s=0.0), at(0.0, 0.0), Shape(100, 3))
    assert a.finished == pytest.approx(2 * profile.prefill_s(1, 100) + 2 * profile.decode_s(2))
    assert b.finished == a.finished


# -- the reference -----------------------------------------------------------------------
def test_reference_for_the_7b_profile(profile):
    ref = reference(profile, Shape(100, 128), fractions=(0.5, 0.7), requests=1500)
    assert ref.capacity_req_per_s == pytest.approx(4.552, abs=0.001)
    assert ref.idle["continuous"].ttft_ms.p50 == pytest.approx(27.6, rel=0.001)
    assert ref.idle["static"].ttft_ms.p50 == pytest.approx(47.6, rel=0.001)
    lockstep = 8 * 128 / (8 * profile.prefill_s(1, 100) + 127 * profile.decode_s(8))
    assert ref.concurrent["continuous"].output_tokens_per_s == pytest.approx(lockstep)
    # equal lengths: both run 8 single-row prefills then 127 decodes in lockstep
    assert ref.concurrent["static"].output_tokens_per_s == pytest.approx(lockstep)
    assert ref.p3("continuous", 0.7) < 1.5 < 10 < ref.p3("static", 0.7)
    assert ref.p4(0.5) > 10
    assert set(json.loads(json.dumps(ref.to_dict()))["loaded"]) == {"0.5", "0.7"}


def test_scaled_profile_scales_every_time(profile):
    half = scaled(profile, 0.5)
    assert half.decode_s(3) == pytest.approx(profile.decode_s(3) / 2)
    assert half.prefill_s(2, 300) == pytest.approx(profile.prefill_s(2, 300) / 2)
    assert capacity(half, Shape(100, 128), 8) == pytest.approx(2 * capacity(profile, Shape(100, 128), 8))
    assert scaled(profile, 1.0) is profile


def test_cli_prints_the_policies_and_writes_json(tmp_path, capsys):
    out = tmp_path / "des.json"
    main(["--profile", str(PROFILE_7B), "--requests", "300", "--rate", "2.0", "--sweep", "0.9", "--json", str(out)])
    text = capsys.readouterr().out
    assert "capacity 4.552 req/s" in text
    for name in ("continuous", "ideal", "static", "P4 reference"):
        assert name in text
    data = json.loads(out.read_text())
    assert set(data["loaded"]) == {"0.5", "0.7", "0.9"}
    assert data["at_rate"]["rate"] == 2.0


def test_admission_is_the_engines_own_slot_scheduler(profile, monkeypatch):
    """One implementation of admission: the reference asks handler/engine/scheduler.py's
    SlotScheduler, so the requests it admits in each step are the scheduler's, and a change to
    the scheduler's rule changes the reference (this checks the virtual clock, not a copy)."""
    from handler.engine import scheduler as engine_scheduler

    steps: list[list[int]] = []
    original = engine_scheduler.SlotScheduler.schedule

    def recorded(self):
        admitted = original(self)
        if admitted:
            steps.append([a.item.request.prompt_tokens for a in admitted])
        return admitted

    monkeypatch.setattr(engine_scheduler.SlotScheduler, "schedule", recorded)
    policy = Policy("continuous", 3, prefill_token_budget=250)
    simulate(profile, policy, at(0.0, 0.0, 0.0, 0.0), Shape(100, 4))
    assert steps == [[100, 100], [100], [100]]  # budget 250: two, then one (3 slots), then the freed slot

    def one_at_a_time(self):
        self.prefill_token_budget = 1  # the first always goes, nothing after it
        return original(self)

    monkeypatch.setattr(engine_scheduler.SlotScheduler, "schedule", one_at_a_time)
    one_per_step = ttfts(profile, policy, at(0.0, 0.0))
    pf, d1 = profile.prefill_s(1, 100), profile.decode_s(1)
    assert one_per_step == pytest.approx([pf, pf + d1 + pf])


def test_the_budget_study_trades_ttft_for_fewer_pauses_under_closed_long_prompts(capsys):
    """The seed workload's 32 closed-loop streams: one 1500-token prompt per step starts each
    request soonest; a budget that groups waiting prompts pauses the streams less often (lower
    ITL) and makes newcomers wait for the group (higher TTFT). `--budgets` prints each."""
    from scripts.bench import des

    profile = load_profile(PROFILE_7B.parent / "llama-3.1-8b-inf2-48xl-tp8.yaml")
    shape = Shape(1500, 250, 150)
    study = des.budget_study(profile, shape, 32, (2048, 16384), [Load("concurrent", 32 * 4, 32)])
    one, grouped = study["concurrent@32"][2048], study["concurrent@32"][16384]
    assert one.ttft_ms.p50 < grouped.ttft_ms.p50 and grouped.itl_ms.p50 < one.itl_ms.p50
    des.main(["--profile", str(PROFILE_7B), "--policy", "continuous", "--requests", "50", "--budgets", "100,800"])
    out = capsys.readouterr().out
    assert "budget" in out and " 800 " in out.split("(continuous policy; ms")[0]
    with pytest.raises(SystemExit):
        des.main(["--profile", str(PROFILE_7B), "--budgets", "0"])
