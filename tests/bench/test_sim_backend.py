"""The `sim` backend: charged step times (with a fake clock, never the wall clock),
determinism, lengths, EOS, and the streamer contract."""

from pathlib import Path

import pytest
import torch

from handler.backends.base import RowSpec
from handler.backends.sim import SimBackend
from handler.config import ConfigError, ServingConfig
from handler.protocol import SamplingParams
from tests.bench.conftest import FakeClock, sim_model_yaml


class ListStreamer:
    def __init__(self) -> None:
        self.puts: list[torch.Tensor] = []

    def put(self, value: torch.Tensor) -> None:
        self.puts.append(value)

    @property
    def steps(self) -> list[list[int]]:
        return [p.tolist() for p in self.puts[1:]]


def make_backend(model_dir: Path, clock: FakeClock | None = None, **sim) -> SimBackend:
    config = ServingConfig.from_model_yaml(sim_model_yaml(model_dir, **{"time_scale": 1.0, **sim}))
    return SimBackend(config.handler, model_dir, model_dir, clock=clock)


def row(prompt: tuple[int, ...], max_new_tokens: int, ignore_eos: bool = True, **sampling) -> RowSpec:
    return RowSpec(prompt, max_new_tokens, SamplingParams(**sampling), ignore_eos)


def run(backend: SimBackend, rows: list[RowSpec], is_finished=lambda i: False) -> ListStreamer:
    streamer = ListStreamer()
    backend.generate(rows, streamer, is_finished)
    return streamer


def test_steps_charge_the_profile_for_the_live_rows(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    p = backend.profile
    prompt = tuple(range(5, 15))
    run(backend, [row(prompt, 2), row(prompt, 4), row(prompt, 4)])
    expected = [p.prefill_s(3, 10), p.decode_s(3), p.decode_s(2), p.decode_s(2)]
    assert fake_clock.charged == pytest.approx(expected)
    assert backend.model.busy_s == pytest.approx(sum(expected))


def test_compiled_batch_charge_pays_for_padding_rows(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, charge="compiled_batch")
    p = backend.profile
    run(backend, [row((5, 6, 7), 3)])
    assert fake_clock.charged == pytest.approx([p.prefill_s(8, 3), p.decode_s(8), p.decode_s(8)])


def test_time_scale_scales_every_step(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, time_scale=0.5)
    run(backend, [row((5, 6, 7), 2)])
    p = backend.profile
    assert fake_clock.charged == pytest.approx([p.prefill_s(1, 3) / 2, p.decode_s(1) / 2])


def test_streamer_gets_the_prompt_then_one_token_per_row_per_step(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    streamer = run(backend, [row((5, 6, 7), 3), row((8, 9), 3)])
    assert streamer.puts[0].shape == (2, 3)
    assert [tuple(p.shape) for p in streamer.puts[1:]] == [(2,)] * 3


def test_output_depends_on_the_request_only(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    a, b = row((5, 6, 7, 8), 12), row((9, 10), 6)
    alone = [s[0] for s in run(backend, [a]).steps]
    batched = [s[1] for s in run(backend, [b, a]).steps]
    assert alone == batched
    other = [s[0] for s in run(backend, [row((5, 6, 7, 9), 12)]).steps]
    assert other != alone
    seeded = [[s[0] for s in run(backend, [row((5, 6, 7, 8), 12, do_sample=True, seed=s)]).steps] for s in (1, 2)]
    assert seeded[0] != seeded[1]


def test_eos_comes_at_a_deterministic_point_unless_ignored(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock, mean_natural_tokens=3)
    eos = backend.tokenizer.eos_token_id
    first = [s[0] for s in run(backend, [row((5, 6, 7), 50, ignore_eos=False)]).steps]
    assert first[-1] == eos and eos not in first[:-1] and len(first) <= 5
    assert [s[0] for s in run(backend, [row((5, 6, 7), 50, ignore_eos=False)]).steps] == first
    fixed = [s[0] for s in run(backend, [row((5, 6, 7), 50, ignore_eos=True)]).steps]
    assert len(fixed) == 50 and eos not in fixed


def test_a_row_the_engine_finished_stops_costing_time(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    p = backend.profile
    streamer = run(backend, [row((5, 6), 4), row((5, 7), 4)], is_finished=lambda i: i == 0)
    assert fake_clock.charged == pytest.approx([p.prefill_s(2, 2)] + [p.decode_s(1)] * 3)
    assert [s[0] for s in streamer.steps[1:]] == [backend.model.pad_token_id] * 3


def test_more_rows_than_the_compiled_batch_is_an_error(tiny_model_dir, fake_clock):
    backend = make_backend(tiny_model_dir, fake_clock)
    with pytest.raises(ValueError, match="compiled batch size 8"):
        run(backend, [row((5,), 1)] * 9)


def test_sim_without_its_section_fails_with_a_hint(tiny_model_dir):
    raw = sim_model_yaml(tiny_model_dir)
    del raw["handler"]["sim"]
    config = ServingConfig.from_model_yaml(raw)
    with pytest.raises(ConfigError, match=r"handler\.sim"):
        SimBackend(config.handler, tiny_model_dir, tiny_model_dir)


def test_step_functions_serve_a_slot_scheduler(tiny_model_dir, fake_clock):
    """prefill/decode are usable on their own: a slot joins while another is mid-way."""
    model = make_backend(tiny_model_dir, fake_clock).model
    first = model.new_slot(row((5, 6, 7), 4))
    model.prefill([first])
    model.decode([first])
    joined = model.new_slot(row((8, 9), 2))
    model.prefill([joined])
    model.decode([first, joined])
    assert (first.generated, joined.generated, joined.done) == (3, 2, True)
    assert fake_clock.charged[-1] == pytest.approx(model.profile.decode_s(2))
