"""The `sim` backend on the step contract: charged step times (with a fake clock, never
the wall clock), single-row prefills, determinism, EOS, and slot bookkeeping."""

from pathlib import Path

import pytest

from handler.backends import sim
from handler.backends.sim import SimBackend
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.request import SamplingParams, SlotRequest
from scripts.bench.per_slot_sampler import PerSlotSimModel
from tests.support.bench import FakeClock, sim_model_yaml


def make_backend(model_dir: Path, clock: FakeClock | None = None, **sim) -> SimBackend:
    config = ServingConfig.from_model_yaml(sim_model_yaml(model_dir, **{"time_scale": 1.0, **sim}))
    return SimBackend(config.handler, model_dir, model_dir, clock=clock)


def request(slot: int, prompt: tuple[int, ...], ignore_eos: bool = True, **sampling) -> SlotRequest:
    return SlotRequest(slot, prompt, SamplingParams(**sampling), ignore_eos)


def tokens_alone(backend: SimBackend, req: SlotRequest, n: int) -> list[int]:
    out = [backend.prefill([req])[0].token_id]
    out += [backend.decode([req.slot])[0].token_id for _ in range(n - 1)]
    backend.release(req.slot)
    return out


def test_each_new_row_is_prefilled_alone_and_decode_charges_the_live_rows(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    p = backend.profile
    backend.prefill([request(0, tuple(range(5, 15))), request(1, (5, 6, 7))])
    backend.decode([0, 1])
    backend.release(0)
    backend.decode([1])
    # k new rows cost k single-row prefills (the batch-1 context kernel under continuous batching)
    expected = [p.prefill_s(1, 10), p.prefill_s(1, 3), p.decode_s(2), p.decode_s(1)]
    assert fake_clock.charged == pytest.approx(expected)
    assert backend.model.busy_s == pytest.approx(sum(expected))


def test_compiled_batch_charge_pays_for_every_slot(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, charge="compiled_batch")
    p = backend.profile
    backend.prefill([request(3, (5, 6, 7))])
    backend.decode([3])
    assert fake_clock.charged == pytest.approx([p.prefill_s(1, 3), p.decode_s(8)])


def test_time_scale_scales_every_step(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, time_scale=0.5)
    tokens_alone(backend, request(0, (5, 6, 7)), 2)
    p = backend.profile
    assert fake_clock.charged == pytest.approx([p.prefill_s(1, 3) / 2, p.decode_s(1) / 2])


def test_output_depends_on_the_request_only(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    alone = tokens_alone(backend, request(0, (5, 6, 7, 8)), 12)
    backend.prefill([request(0, (9, 10))])  # a batch-mate, mid-way
    backend.decode([0])
    joined = [backend.prefill([request(5, (5, 6, 7, 8))])[0].token_id]
    joined += [backend.decode([0, 5])[1].token_id for _ in range(11)]
    backend.release(0)
    backend.release(5)
    assert joined == alone
    assert tokens_alone(backend, request(0, (5, 6, 7, 9)), 12) != alone
    seeded = [tokens_alone(backend, request(0, (5, 6, 7, 8), do_sample=True, seed=s), 12) for s in (1, 2)]
    assert seeded[0] != seeded[1]


def test_the_model_emits_eos_at_a_deterministic_point_unless_ignored(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, mean_natural_tokens=3)
    eos = backend.tokenizer.eos_token_id
    first = tokens_alone(backend, request(0, (5, 6, 7), ignore_eos=False), 6)
    assert eos in first[:5]
    assert tokens_alone(backend, request(0, (5, 6, 7), ignore_eos=False), 6) == first
    assert eos not in tokens_alone(backend, request(0, (5, 6, 7), ignore_eos=True), 50)


def test_slot_bookkeeping_errors(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    backend.prefill([request(0, (5,))])
    with pytest.raises(ValueError, match="slot 0 is occupied"):
        backend.prefill([request(0, (6,))])
    with pytest.raises(ValueError, match="hold no sequence"):
        backend.decode([0, 1])
    backend.release(0)
    backend.release(0)  # releasing a free slot is harmless
    assert backend.n_slots == backend.profile.batch_size == 8


def test_sim_without_its_section_fails_with_a_hint(tiny_model_dir):
    raw = sim_model_yaml(tiny_model_dir)
    del raw["handler"]["sim"]
    config = ServingConfig.from_model_yaml(raw)
    with pytest.raises(ConfigError, match=r"handler\.sim"):
        SimBackend(config.handler, tiny_model_dir, tiny_model_dir)


def test_a_seeded_sampled_request_is_the_same_whatever_its_batch(tiny_model_dir, fake_clock):
    """Sampled rows take the sampler's pick (its own per-request generator), so a seeded request's
    tokens do not depend on its slot, its batch-mates or the batch size."""
    backend = make_backend(tiny_model_dir, fake_clock)
    params = {"do_sample": True, "temperature": 0.8, "top_p": 0.9, "seed": 99}
    alone = tokens_alone(backend, request(0, (5, 6, 7, 8), **params), 12)
    mates = [request(s, (9, 10 + s), do_sample=True, temperature=1.1) for s in (0, 1, 3)]
    backend.prefill(mates)
    backend.decode([0, 1, 3])
    joined = [backend.prefill([request(6, (5, 6, 7, 8), **params)])[0].token_id]
    live = [0, 1, 3, 6]
    for step in range(11):
        if step == 4:  # the batch shrinks mid-way
            backend.release(1)
            live.remove(1)
        joined.append(backend.decode(live)[live.index(6)].token_id)
    assert joined == alone
    assert len(set(alone)) > 3


def test_the_host_sampler_runs_on_logits_as_wide_as_the_profiles_vocabulary(tiny_model_dir, fake_clock, monkeypatch):
    """Every step ends with one sampler call over [rows, profile vocab_size] logits: the host cost
    the bench must see (greedy rows included: their argmax over the vocabulary), with the batched
    sampler and with the bench's per-slot baseline (P2s)."""
    for sampler in ("batched", "per_slot"):
        if sampler == "per_slot":
            monkeypatch.setattr(sim, "SimModel", PerSlotSimModel)
        backend = make_backend(tiny_model_dir, fake_clock)
        calls = []
        real = backend.model.sampler.sample

        def spy(slots, logits, *args, real=real, calls=calls):
            calls.append((list(slots), tuple(logits.shape)))
            return real(slots, logits, *args)

        backend.model.sampler.sample = spy
        backend.prefill([request(0, (5, 6)), request(2, (7, 8), do_sample=True, top_p=0.9)])
        backend.decode([0, 2])
        vocab = backend.profile.vocab_size
        assert calls == [([0, 2], (2, vocab)), ([0, 2], (2, vocab))], sampler
