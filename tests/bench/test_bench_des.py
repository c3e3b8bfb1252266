"""The discrete-event policy reference: hand-checkable cases, not timings."""

import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_des import Workload, p3, slot_ttfts, static_ttfts

from handler.backends.sim_profile import load_profile
from tests.bench.conftest import PROFILE_7B


@dataclass(frozen=True)
class Fixed(Workload):
    times: tuple[float, ...] = ()

    def arrivals(self) -> list[float]:
        return list(self.times)


@pytest.fixture(scope="module")
def profile():
    return load_profile(PROFILE_7B)


def test_a_lone_request_waits_the_batch_delay_then_prefills(profile):
    w = Fixed(1.0, 1, 100, 16, times=(0.0,))
    assert static_ttfts(profile, w, 0.02) == pytest.approx([0.02 + profile.prefill_s(1, 100)])
    assert slot_ttfts(profile, w) == pytest.approx([profile.prefill_s(1, 100)])


def test_a_full_batch_goes_at_once_and_the_next_waits_for_all_of_it(profile):
    w = Fixed(1.0, 9, 100, 16, times=(0.0,) * 9)
    ttfts = static_ttfts(profile, w, 0.02)
    batch = profile.prefill_s(8, 100) + 15 * profile.decode_s(8)
    assert ttfts[:8] == pytest.approx([profile.prefill_s(8, 100)] * 8)
    assert ttfts[8] == pytest.approx(batch + 0.02 + profile.prefill_s(1, 100))
    # a slot scheduler lets the ninth in as soon as the first eight finish, without the delay
    assert slot_ttfts(profile, w)[8] == pytest.approx(batch + profile.prefill_s(1, 100))


def test_slots_beat_static_micro_batching_under_load(profile):
    result = p3(profile, 0.7, 100, 128, 0.02)
    assert result["slots"]["P3"] < result["static"]["P3"]
    assert result["static"]["idle_ttft_ms"] == pytest.approx(20 + 27.6, rel=0.01)
    assert result["slots"]["idle_ttft_ms"] == pytest.approx(27.6, rel=0.01)
