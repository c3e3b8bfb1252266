"""The sim's modelled speculation (handler/backends/sim.py, scheduler.speculation on backend sim): a
verify step gives each row 1 to k + 1 tokens, (1 - a^(k+1)) / (1 - a) on average for an acceptance
rate a, drawn per request (reproducible, whoever the batch-mates are), the row's own tokens as one
step at a time would give them; and it charges one forward of (k + 1) x rows tokens from the profile,
whatever is accepted. A fake clock records the charges: nothing sleeps."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from handler.backends.loader import load_backend
from handler.backends.sim import SimModel
from handler.backends.sim_profile import Profile, expected_tokens_per_step
from handler.config import ServingConfig, SimConfig
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine
from handler.request import DecodeRow, GenerationRequest, SamplingParams, SlotRequest
from tests.support.bench import PROFILE_7B, FakeClock

EOS = 2
VOCAB = tuple(range(3, 200))
# A decode table linear in the forward's tokens (10 ms + 1 ms a token), so a verify's width shows in its charge.
PROFILE = Profile(
    name="test",
    source="tests/unit/test_sim_speculation.py",
    batch_size=8,
    n_positions=8192,
    vocab_size=256,
    context_buckets=(128,),
    decode_step_ms={1: 11.0, 8: 18.0},
    prefill_ms={128: 20.0},
)


def model(k: int, rate: float, clock: FakeClock | None = None, **sim: Any) -> SimModel:
    config = SimConfig(profile="unused", time_scale=1.0, speculation_acceptance=rate, **sim)
    return SimModel(PROFILE, VOCAB, EOS, PROFILE.n_positions, config, clock or FakeClock(), draft_tokens=k)


def request(slot: int, prompt: tuple[int, ...], ignore_eos: bool = True, **sampling: Any) -> SlotRequest:
    return SlotRequest(slot, prompt, SamplingParams(**sampling), ignore_eos)


def batch(n: int, **sampling: Any) -> list[SlotRequest]:
    return [request(slot, (5 + slot, 6, 7, 8 + slot), **sampling) for slot in range(n)]


def serve(sim: SimModel, requests: list[SlotRequest], steps: int, max_tokens: int) -> dict[int, list[list[int]]]:
    """Each slot's tokens, step by step: the prefill's one, then `steps` decode steps of every row."""
    out = {r.slot: [[c.token_id]] for r, c in zip(requests, sim.prefill(requests), strict=True)}
    for _ in range(steps):
        rows = [DecodeRow(r.slot, max_tokens) for r in requests]
        for r, got in zip(requests, sim.decode_plan(rows), strict=True):
            out[r.slot].append([c.token_id for c in got])
    return out


def decode_steps(out: dict[int, list[list[int]]]) -> list[int]:
    """Tokens per row and decode step (the prefill's left out)."""
    return [len(step) for steps in out.values() for step in steps[1:]]


def spread(rate: float, k: int) -> float:
    """Standard deviation of one row's tokens from one verify step, T = 1 + the accepted run:
    P(T = j) = a^(j-1) (1 - a) for j <= k, P(T = k + 1) = a^k."""
    p = {j: rate ** (j - 1) * (1 - rate) for j in range(1, k + 1)} | {k + 1: rate**k}
    mean = sum(j * q for j, q in p.items())
    return math.sqrt(sum((j - mean) ** 2 * q for j, q in p.items()))


def test_the_formula():
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_step(0.9, 0) == 1.0
    with pytest.raises(ValueError, match="acceptance"):
        expected_tokens_per_step(1.2, 3)


@pytest.mark.parametrize(("rate", "k"), [(0.3, 3), (0.6, 4), (0.9, 2)])
def test_tokens_per_step_are_1_to_k_plus_1_with_the_formula_s_mean(rate: float, k: int):
    """8 rows x 150 steps = 1200 draws (fixed seeds: the requests'): the mean within 4 standard errors
    of the formula, and the share of steps taking every drafted token within 4 of a^k."""
    steps = decode_steps(serve(model(k, rate), batch(8), 150, k + 1))
    assert min(steps) >= 1 and max(steps) <= k + 1
    expected = expected_tokens_per_step(rate, k)
    mean = sum(steps) / len(steps)
    assert abs(mean - expected) <= 4 * spread(rate, k) / math.sqrt(len(steps)), (mean, expected)
    full = sum(n == k + 1 for n in steps) / len(steps)
    assert abs(full - rate**k) <= 4 * math.sqrt(rate**k * (1 - rate**k) / len(steps)), (full, rate**k)


def test_a_verify_step_charges_k_plus_1_tokens_per_row_whatever_is_accepted():
    clock = FakeClock()
    sim = model(3, 0.5, clock)
    serve(sim, batch(3), 2, 4)
    # 3 prefills, then two verify steps of (3 + 1) x 3 rows = 12 tokens: 10 + 12 ms each
    assert clock.charged == pytest.approx([0.02] * 3 + [PROFILE.verify_s(3, 3)] * 2)
    assert PROFILE.verify_s(3, 3) == pytest.approx(PROFILE.decode_s(12)) == pytest.approx(0.022)
    assert sim.busy_s == pytest.approx(0.06 + 0.044)


def test_compiled_batch_charges_k_plus_1_tokens_for_every_slot():
    clock = FakeClock()
    serve(model(2, 0.5, clock, charge="compiled_batch"), batch(2), 1, 3)
    assert clock.charged[-1] == pytest.approx(PROFILE.decode_s(3 * 8))


def test_rate_0_gives_one_token_a_step_for_the_wider_forward():
    clock = FakeClock()
    out = serve(model(4, 0.0, clock), batch(4), 20, 5)
    assert set(decode_steps(out)) == {1}
    assert clock.charged[-1] == pytest.approx(PROFILE.decode_s(5 * 4)) and PROFILE.decode_s(20) > PROFILE.decode_s(4)


def test_rate_1_gives_every_row_what_it_may_take():
    """A row takes at most its max_tokens (what its sequence may still generate)."""
    sim = model(3, 1.0)
    sim.prefill(batch(3))
    got = sim.decode_plan([DecodeRow(0, 4), DecodeRow(1, 2), DecodeRow(2, 1)])
    assert [len(tokens) for tokens in got] == [4, 2, 1]


def test_same_requests_same_steps_whoever_the_batch_mates():
    """The acceptance draws are the request's own: reproducible run to run, and the same alone as
    beside other rows."""
    mates = serve(model(3, 0.6), batch(5), 40, 4)
    assert serve(model(3, 0.6), batch(5), 40, 4) == mates
    alone = serve(model(3, 0.6), [batch(5)[2]], 40, 4)
    assert alone[2] == mates[2]
    assert mates[1] != mates[2]  # each request draws its own


def test_the_text_is_what_one_token_a_step_gives():
    """The row's tokens are the sim's own, as single steps would draw them (greedy and sampled
    rows), so speculation changes the pace only, as a real verify would."""
    for sampling in ({}, {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 7}):
        fast = serve(model(4, 0.7), batch(4, **sampling), 30, 5)
        joined = {slot: [t for step in steps for t in step] for slot, steps in fast.items()}
        n = min(len(tokens) for tokens in joined.values())
        slow = serve(model(0, 0.7), batch(4, **sampling), n - 1, 1)
        assert {slot: [t for step in steps for t in step] for slot, steps in slow.items()} == {
            slot: tokens[:n] for slot, tokens in joined.items()
        }


def test_a_row_stops_at_its_eos():
    sim = model(4, 1.0, mean_natural_tokens=3)
    requests = [request(slot, (5 + slot, 6, 7), ignore_eos=False) for slot in range(6)]
    first = sim.prefill(requests)
    got = sim.decode_plan([DecodeRow(r.slot, 5) for r in requests])
    ended = [tokens for c, tokens in zip(first, got, strict=True) if c.token_id != EOS]
    assert any(EOS in [t.token_id for t in tokens] for tokens in ended)
    for tokens in ended:
        ids = [t.token_id for t in tokens]
        assert EOS not in ids[:-1]  # nothing after the EOS
        assert len(ids) == 5 or ids[-1] == EOS


# -- through the loader and the engine ---------------------------------------------------------
def sim_config(model_dir: Path, k: int | None, rate: float = 0.5) -> ServingConfig:
    scheduler: dict[str, Any] = {"mode": "continuous", "n_slots": 8}
    if k is not None:
        scheduler["speculation"] = {"method": "ngram", "num_speculative_tokens": k}
    return ServingConfig.from_model_yaml(
        {
            "continuousBatching": True,
            "batchSize": 16,
            "maxBatchDelay": 1,
            "jobQueueSize": 32,
            "scheduler": scheduler,
            "handler": {
                "model_checkpoint_dir": str(model_dir),
                "backend": "sim",
                "n_positions": 4096,
                "max_new_tokens": 1024,
                "sim": {"profile": str(PROFILE_7B), "time_scale": 0.0, "speculation_acceptance": rate},
            },
        }
    )


def test_the_loader_passes_k_and_the_sim_drafts_itself(tiny_model_dir: Path):
    plain = load_backend(sim_config(tiny_model_dir, None), tiny_model_dir)
    assert (plain.draft_tokens, plain.tokens_per_step) == (0, 1)
    fast = load_backend(sim_config(tiny_model_dir, 3), tiny_model_dir)
    assert (fast.draft_tokens, fast.tokens_per_step) == (3, 4)


def test_the_engine_serves_the_same_text_in_fewer_steps(tiny_model_dir: Path):
    """The step engine over the sim with speculation: each request's output is k = 0's, the engine
    takes several tokens a row a step from it, about the formula's number."""

    def serve_all(k: int | None) -> tuple[dict[str, tuple[int, ...]], list[tuple[int, int]]]:
        backend = load_backend(sim_config(tiny_model_dir, k, rate=0.7), tiny_model_dir)
        engine = StepEngine(backend, prefill_token_budget=10_000)
        sequences = {}
        for i in range(4):
            req = GenerationRequest(f"speculate {i} " * (i + 1), 60, ignore_eos=True)
            sequences[str(i)] = Sequence(
                req, backend.encode(req.prompt), backend.tokenizer, backend.eos_token_ids, str(i)
            )
            engine.submit(sequences[str(i)])
        while not engine.scheduler.idle:
            engine.step()
        records = [(r.decoded, r.decoded_tokens) for r in engine.take_records() if r.decoded]
        return {i: tuple(s.token_ids) for i, s in sequences.items()}, records

    plain, plain_steps = serve_all(None)
    fast, fast_steps = serve_all(3)
    assert fast == plain and all(len(ids) == 60 for ids in fast.values())
    assert all(rows == tokens for rows, tokens in plain_steps)
    assert len(fast_steps) < len(plain_steps)
    rows, tokens = sum(r for r, _ in fast_steps), sum(t for _, t in fast_steps)
    assert 1.5 < tokens / rows <= 4  # E = 2.53 at a = 0.7, k = 3 (the last steps of a row take fewer)
