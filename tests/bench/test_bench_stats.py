"""The benchmark's arithmetic: percentiles, per-request ITL, load specs, ratios, SSE/NDJSON parsing."""

import argparse
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench import Lengths, Load, _parse_event, parse_load
from bench_stats import format_table, from_dict, percentile, summarize
from bench_suite import compute_ratios, handler_metrics


def req(started, first, last, ended, tokens, error=None):
    return {
        "scheduled": started,
        "started": started,
        "first_token": first,
        "last_token": last,
        "ended": ended,
        "prompt_tokens": 10,
        "completion_tokens": tokens,
        "finish_reason": "length",
        "error": error,
    }


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5], 99) == 5
    assert math.isnan(percentile([], 50))


def test_summary_uses_usage_tokens_and_guidellm_itl():
    requests = [
        req(0.0, 0.1, 1.1, 1.2, 11),  # ITL 100 ms, TTFT 100 ms
        req(0.5, 0.8, 1.8, 2.0, 6),  # ITL 200 ms, TTFT 300 ms
        req(1.0, None, None, 1.1, 0, error="HTTP 503"),
    ]
    s = summarize("x", "poisson", 1, 2.0, requests)
    assert (s.requests_ok, s.requests_failed) == (2, 1)
    assert s.duration_s == pytest.approx(2.0)
    assert s.output_tokens_per_s == pytest.approx(17 / 2.0)
    assert s.requests_per_s == pytest.approx(1.0)
    assert s.itl_ms.p50 == pytest.approx(150.0)
    assert s.ttft_ms.p50 == pytest.approx(200.0)
    assert s.latency_s.p50 == pytest.approx(1.35)
    assert s.errors == ["HTTP 503"]
    assert s.offered_rate == 2.0
    assert from_dict(s.to_dict()) == s
    assert "x" in format_table([s])


def test_load_specs():
    assert parse_load("synchronous:20") == Load("synchronous", 20)
    assert parse_load("concurrent:8:80") == Load("concurrent", 80, streams=8)
    assert parse_load("poisson:3.5:300") == Load("poisson", 300, rate=3.5)
    assert parse_load("constant:2:10").name == "constant@2.00/s"
    assert parse_load("sweep:4:50") == ("sweep", 4, 50)
    for bad in ("poisson:0:10", "concurrent:8", "bursty:1:2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_load(bad)


def test_lengths_are_drawn_around_the_mean():
    import random

    rng = random.Random(0)
    assert Lengths(128).draw(rng) == 128
    draws = [Lengths(100, 10).draw(rng) for _ in range(2000)]
    assert 98 < sum(draws) / len(draws) < 102 and min(draws) >= 1


def test_stream_events_native_and_openai():
    assert _parse_event("native", '{"text": "ab"}') == ("ab", None, None, None)
    usage = {"prompt_tokens": 3, "completion_tokens": 5}
    assert _parse_event("native", '{"text": "", "finish_reason": "length", "usage": {"prompt_tokens": 3, '
                        '"completion_tokens": 5}}') == ("", usage, "length", None)  # fmt: skip
    assert _parse_event("openai", 'data: {"choices": [{"text": "hi", "finish_reason": null}]}')[0] == "hi"
    assert (
        _parse_event("openai", 'data: {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}}')[1]
        == usage
    )
    assert _parse_event("openai", "data: [DONE]") == ("", None, None, None)
    assert _parse_event("native", '{"error": {"message": "boom"}}')[3] == "boom"


def test_ratios_from_summaries():
    sync = summarize("synchronous", "synchronous", 1, 0, [req(0, 0.05, 0.05 + 0.0066 * 9, 0.2, 10)])
    conc = summarize("concurrent@8", "concurrent", 8, 0, [req(0, 0.1, 1.0, 1.0, 600)])
    rated = summarize("poisson", "poisson", 1, 3.0, [req(0, 0.1, 0.5, 0.6, 10)])
    ref = {"step_1_ms": 6.6, "ideal_tokens_per_s": 661.0, "generate_tokens_per_s": 500.0}
    by_kind = {"synchronous": sync, "concurrent": conc, "poisson": rated}
    r = compute_ratios("sim", ref, by_kind)
    assert r["P1"] == pytest.approx(1.0)
    assert r["P2"] == pytest.approx(600 / 661)
    assert r["P3"] == pytest.approx(2.0)
    assert compute_ratios("hf", ref, by_kind) == {"P5": pytest.approx(600 / 500)}


def test_handler_metrics_means_from_a_scrape():
    text = "\n".join(
        [
            "# TYPE llm_time_to_first_token_seconds histogram",
            'llm_time_to_first_token_seconds_sum{ModelName="m",} 3.0',
            'llm_time_to_first_token_seconds_count{ModelName="m",} 4.0',
            'llm_time_to_first_token_seconds_bucket{le="0.1",} 1.0',
        ]
    )
    assert handler_metrics(text) == {"llm_time_to_first_token_seconds": 0.75}
