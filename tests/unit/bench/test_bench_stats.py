"""The benchmark's arithmetic: percentiles, per-request ITL, load specs, ratios, SSE/NDJSON
parsing, the suite's model configs and load plan, the sweep and its plot."""

import argparse
import copy
import math

import pytest

from scripts.bench.client import Lengths, Load, _parse_event, parse_load
from scripts.bench.stats import (
    SweepPoint,
    arrival_offsets,
    format_table,
    from_dict,
    knee,
    percentile,
    summarize,
    sweep_points,
)
from scripts.bench.suite import (
    ModeRun,
    Ratio,
    best_in_process,
    compute_ratios,
    handler_metrics,
    histogram_totals,
    model_name,
    parse_json_output,
    plan_loads,
    sim_model_config,
    with_scheduler,
)
from tests.support.bench import PROFILE_7B


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


def run_of(mode, served, limits=None, fractions=None):
    return ModeRun(mode, {}, served, limits or [None] * len(served), fractions or {})


def test_ratios_from_summaries():
    sync = summarize("synchronous", "synchronous", 1, 0, [req(0, 0.05, 0.05 + 0.0066 * 9, 0.2, 10)])
    conc = summarize("concurrent@8", "concurrent", 8, 0, [req(0, 0.1, 1.0, 1.0, 600)])
    at70 = summarize("p70", "poisson", 1, 3.0, [req(0, 0.1, 0.5, 0.6, 10)])
    at50 = summarize("p50", "poisson", 1, 2.0, [req(0, 0.04, 0.5, 0.6, 10)])
    static50 = summarize("p50", "poisson", 1, 2.0, [req(0, 0.6, 1.0, 1.1, 10)])
    des_conc = summarize("des", "concurrent", 8, 0, [req(0, 0.1, 1.0, 1.0, 630)])
    des_sync = summarize("des", "synchronous", 1, 0, [req(0, 0.04, 0.1, 0.1, 10)])
    des_70 = summarize("des", "poisson", 1, 3.0, [req(0, 0.05, 0.5, 0.5, 10)])
    cont = run_of(
        "continuous",
        [sync, conc, at50, at70],
        [des_sync, des_conc, None, des_70],
        {"p50": 0.5, "p70": 0.7},
    )
    static = run_of("static", [static50], fractions={"p50": 0.5})
    r = {x.name: x for x in compute_ratios("sim", {"continuous": cont, "static": static}, step_1_ms=6.6)}
    assert r["P1"].value == pytest.approx(1.0)
    assert r["P2"].value == pytest.approx(600 / 630)
    assert r["P3"].value == pytest.approx(100 / 50)
    assert r["P3"].limit == pytest.approx(50 / 40)
    assert r["P4"].value == pytest.approx(600 / 40) and r["P4"].limit is None
    assert [x.met for x in r.values()] == [True, True, False, True]
    assert r["P2"].line().startswith("P2 0.95  goal >= 0.95 met  = served 600.0 tok/s (8 streams) / DES 630.0 tok/s")
    assert "NOT met" in r["P3"].line() and "(policy limit: 1.25)" in r["P3"].line()
    # without the static mode there is no P4; without a limit for the concurrent load no P2
    only = compute_ratios("sim", {"continuous": run_of("continuous", [sync, conc])}, step_1_ms=6.6)
    assert [x.name for x in only] == ["P1"]
    hf_run = {"continuous": run_of("continuous", [sync, conc])}
    hf = compute_ratios("hf", hf_run, in_process_tokens_per_s={1: 40.0, 8: 500.0})
    assert [(x.name, x.value) for x in hf] == [("P5-single", pytest.approx(50 / 40)), ("P5", pytest.approx(600 / 500))]
    assert hf[0].line() == (
        "P5-single 1.25  goal >= 0.9 met  = served 50.0 tok/s (1 stream) / in-process 40.0 tok/s (batch 1)"
    )
    assert (
        hf[1].line() == "P5 1.20  goal >= 0.9 met  = served 600.0 tok/s (8 streams) / in-process 500.0 tok/s (batch 8)"
    )
    # a batch the in-process loop did not measure has no ratio
    only_p5 = compute_ratios("hf", hf_run, in_process_tokens_per_s={8: 500.0})
    assert [x.name for x in only_p5] == ["P5"]
    assert compute_ratios("hf", hf_run, in_process_tokens_per_s=None) == []


def measured(batch: int, tokens_per_s: float, step_ms: float) -> dict:
    return {"batch": batch, "steps": 63, "first_token_ms": 200.0, "step_ms": step_ms, "tokens_per_s": tokens_per_s}


def test_best_in_process_keeps_the_fastest_run_at_each_batch():
    before = {"backend": "hf", "batch_size": 4, "measured": {"batch_1": measured(1, 15.0, 60.0)}}
    before["measured"]["batch_4"] = measured(4, 36.0, 98.0)
    after = {"backend": "hf", "batch_size": 4, "measured": {"batch_1": measured(1, 16.5, 55.0)}}
    after["measured"]["batch_4"] = measured(4, 33.0, 105.0)
    best = best_in_process([before, after])
    assert best["tokens_per_s_by_batch"] == {1: 16.5, 4: 36.0}
    assert best["step_ms_by_batch"] == {1: 55.0, 4: 98.0}
    assert best["tokens_per_s_runs"] == [{1: 15.0, 4: 36.0}, {1: 16.5, 4: 33.0}]
    assert best["generate_tokens_per_s"] == 36.0 and best["step_1_ms"] == 55.0 and best["step_batch_ms"] == 98.0
    assert best["measured"] == {"batch_1": after["measured"]["batch_1"], "batch_4": before["measured"]["batch_4"]}
    assert "tokens_per_s_by_batch" not in before  # the references are not changed


def test_model_name_from_source_json_or_the_folder(tmp_path):
    assert model_name(tmp_path) == tmp_path.name
    (tmp_path / "SOURCE.json").write_text('{"model": "HuggingFaceTB/SmolLM2-135M-Instruct"}')
    assert model_name(tmp_path) == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_ratio_goals_and_json():
    assert Ratio("P4", 9.99, "a", "b").met is False
    assert Ratio("P4", 10.0, "a", "b").met is True
    assert Ratio("P1", 1.05, "a", "b").to_dict() | {} == {
        "name": "P1",
        "value": 1.05,
        "numerator": "a",
        "denominator": "b",
        "limit": None,
        "baseline": None,
        "goal": "<= 1.05",
        "met": True,
    }


def test_model_configs_per_mode():
    base = sim_model_config(PROFILE_7B, 0.5)
    original = copy.deepcopy(base)
    cont = with_scheduler(base, "continuous", 8, prefill_token_budget=1024, overlap=False)
    assert cont["continuousBatching"] is True
    assert (cont["batchSize"], cont["maxBatchDelay"]) == (16, 1)
    assert cont["scheduler"] == {"mode": "continuous", "n_slots": 8, "prefill_token_budget": 1024, "overlap": False}
    assert cont["handler"]["sim"]["time_scale"] == 0.5
    static = with_scheduler(cont, "static", 8)  # from any starting point
    assert "continuousBatching" not in static
    assert (static["batchSize"], static["maxBatchDelay"], static["micro_batching"]["micro_batch_size"]) == (8, 20, 8)
    assert static["scheduler"] == {"mode": "static", "n_slots": 8}
    assert with_scheduler(base, "continuous", 8, in_flight=12)["batchSize"] == 12
    assert base == original  # not modified in place
    with pytest.raises(ValueError):
        with_scheduler(base, "bursty", 8)


def test_model_configs_pass_the_handlers_validation():
    from handler.config import ServingConfig

    base = sim_model_config(PROFILE_7B, 1.0)
    for mode in ("continuous", "static"):
        serving = ServingConfig.from_model_yaml(with_scheduler(base, mode, 8))
        assert serving.scheduler.mode == mode and serving.scheduler.n_slots == 8


def test_plan_loads_sweep_and_ratio_points():
    plan = plan_loads(4.0, 8, 20, 10, sweep=(0.1, 0.95), ratio_fractions=(0.5, 0.7), ratio_requests=100)
    kinds = [(x.kind, x.requests, x.streams) for x in plan.loads]
    assert kinds[:2] == [("synchronous", 20, 1), ("concurrent", 80, 8)]
    rates = [x.rate for x in plan.loads[2:]]
    assert rates == pytest.approx([0.4, 2.0, 2.8, 3.8])
    # max(12, rate x 15 s), and at least 100 where a ratio reads the load
    assert [x.requests for x in plan.loads[2:]] == [12, 100, 100, 57]
    assert sorted(plan.fractions.values()) == pytest.approx([0.1, 0.5, 0.7, 0.95])
    assert plan.loads[4].name == "poisson 70% 2.80/s" and plan.fractions[plan.loads[4].name] == 0.7
    hf = plan_loads(None, 4, 20, 10)
    assert [x.kind for x in hf.loads] == ["synchronous", "concurrent"] and hf.fractions == {}


def test_arrival_offsets_match_the_old_client():
    import random

    rng, t, old = random.Random(2), 0.0, []
    for _ in range(5):
        old.append(t)
        t += rng.expovariate(3.0)
    assert arrival_offsets("poisson", 3.0, 5, 2) == old
    assert arrival_offsets("constant", 4.0, 3, 0) == [0.0, 0.25, 0.5]


def point(fraction, p50, p90=None, itl=10.0, tok=100.0):
    return SweepPoint(fraction, fraction * 4, p50, p90 if p90 is not None else 2 * p50, itl, tok)


def test_sweep_points_and_knee():
    loads = [
        summarize("sync", "synchronous", 1, 0, [req(0, 0.03, 0.3, 0.3, 10)]),
        summarize("b", "poisson", 1, 3.0, [req(0, 0.09, 0.5, 0.6, 10)]),
        summarize("a", "poisson", 1, 1.0, [req(0, 0.04, 0.5, 0.6, 10)]),
    ]
    points = sweep_points(loads, capacity=4.0)
    assert [p.fraction for p in points] == [0.25, 0.75]
    assert points[1] == SweepPoint(
        0.75, 3.0, pytest.approx(90.0), pytest.approx(90.0), pytest.approx(410 / 9), pytest.approx(10 / 0.6)
    )
    curve = [point(0.1, 30), point(0.5, 50, p90=200), point(0.9, 300)]
    assert knee(curve, idle_ttft_ms=30) == 0.9
    assert knee(curve, idle_ttft_ms=30, tail=True) == 0.5
    assert knee(curve[:2], idle_ttft_ms=30) is None


def test_table_with_limits():
    s = summarize("poisson 70% 3.19/s", "poisson", 1, 3.19, [req(0, 0.05, 0.5, 0.6, 10)])
    limit = summarize("des", "poisson", 1, 3.19, [req(0, 0.04, 0.4, 0.4, 10)])
    text = format_table([s, s], [limit, None])
    lines = text.splitlines()
    assert "limit TTFT" in lines[0]
    assert lines[2].endswith("|       40.0  40.00    25.0")
    assert "|" not in lines[3]
    assert "limit" not in format_table([s])


def test_sweep_plot_on_synthetic_data(tmp_path):
    from scripts.bench.plot import plot_sweep

    fractions = (0.1, 0.3, 0.5, 0.7, 0.85, 0.95)
    curves = {
        "continuous": [point(f, 28 + (900 if f > 0.9 else 5 * f)) for f in fractions],
        "static": [point(f, 48 + 600 * f) for f in fractions],
    }
    limits = {m: [point(p.fraction, 0.9 * p.ttft_p50_ms) for p in pts] for m, pts in curves.items()}
    knees = {"continuous": {"p50": 0.95, "p90": 0.7}, "static": {"p50": 0.3, "p90": None}}
    path = plot_sweep(curves, tmp_path / "sweep.png", 4.55, "synthetic", limits, limits, knees)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_sweep({"continuous": curves["continuous"]}, tmp_path / "one.png", 4.55).exists()


def test_json_output_after_log_lines():
    assert parse_json_output('loading...\n{\n "a": 1\n}\n') == {"a": 1}
    with pytest.raises(ValueError):
        parse_json_output("nothing here")


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


def test_handler_metrics_since_an_earlier_scrape():
    """P2s's sampled load reads the histograms' growth since the scrape before it."""
    before = histogram_totals("llm_step_sampling_seconds_sum 1.0\nllm_step_sampling_seconds_count 10.0\n")
    after = "llm_step_sampling_seconds_sum 4.0\nllm_step_sampling_seconds_count 20.0\n"
    assert handler_metrics(after, before) == {"llm_step_sampling_seconds": pytest.approx(0.3)}
    assert handler_metrics(after, histogram_totals(after)) == {}  # nothing recorded since
