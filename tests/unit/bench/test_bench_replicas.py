"""The bench's replicas stage (scripts/bench/replicas.py): its plan and limits, the published
rows against shared/inf2-benchmarks.md, the suite's options for it. The stage's runs are in
tests/perf/test_bench_replicas_runs.py."""

import copy
import re
from dataclasses import replace
from pathlib import Path

import pytest

from scripts.bench import replicas as bench_replicas
from tests.support.bench import PROFILE_7B, REPO

P_LINE = re.compile(r"P\d[a-z-]* \d+\.\d\d  goal [<>]= [\d.]+ (met|NOT met)  = .+ / .+")
SHARED_BENCHMARKS = REPO.parent / "shared" / "inf2-benchmarks.md"


def settings(tmp_path: Path, **kw) -> bench_replicas.Settings:
    return bench_replicas.Settings(model_dir=REPO / "models" / "tiny-llama", workdir=tmp_path, **kw)


def test_plan_of_the_shipped_3x_tp8_layout(tmp_path):
    plan = bench_replicas.plan(settings(tmp_path))
    assert (plan.replicas, plan.n_slots, plan.streams) == (3, 32, 32)
    assert [x.name for x in plan.loads["replicas"]] == [
        "synchronous",
        "concurrent@8",
        "concurrent@32",
        "concurrent@96",
        "concurrent@128",  # the published DP3 x TP8 vLLM run's users (P11)
    ]
    assert [(x.streams, x.requests) for x in plan.loads["replicas"]] == [
        (1, 2),
        (8, 16),
        (32, 64),
        (96, 192),
        (128, 256),
    ]
    assert [(x.streams, x.requests) for x in plan.loads["single"]] == [(32, 64)]
    assert plan.p7_names == ("concurrent@96", "concurrent@32 1 replica")
    many, one = plan.configs["replicas"], plan.configs["single"]
    assert many["scheduler"]["replicas"] == 3 and many["batchSize"] == 192 and many["jobQueueSize"] == 384
    assert one["scheduler"]["replicas"] == 1 and one["batchSize"] == 64 and one["jobQueueSize"] == 128
    for config in (many, one):  # same profile, time scale and scheduler otherwise
        assert config["handler"]["sim"]["profile"] == str(bench_replicas.SEED_PROFILE.resolve())
        assert config["handler"]["sim"]["time_scale"] == 1.0
        assert {k: v for k, v in config["scheduler"].items() if k != "replicas"} == {
            "mode": "continuous",
            "n_slots": 32,
            "prefill_token_budget": 2048,
            "overlap": True,
        }
    assert plan.shape.prompt_tokens == 1500 and plan.shape.output_tokens == 250


def test_plan_adds_r_x_b_and_refuses_one_replica(tmp_path):
    plan = bench_replicas.plan(settings(tmp_path, levels=(1, 5), streams=4, rounds=3))
    assert [x.name for x in plan.loads["replicas"]] == ["synchronous", "concurrent@5", "concurrent@12"]
    assert plan.loads["single"][0].requests == 12 and plan.p7_names[0] == "concurrent@12"

    single = tmp_path / "one.yaml"
    single.write_text(bench_replicas.SEED_CONFIG.read_text().replace("replicas: 3", "replicas: 1"))
    with pytest.raises(ValueError, match=r"scheduler\.replicas is 1"):
        bench_replicas.plan(settings(tmp_path, config=single))
    with pytest.raises(ValueError, match="batch size 8"):  # the 7B profile has 8 slots, the config 32
        bench_replicas.plan(settings(tmp_path, profile=PROFILE_7B))


def test_deal_and_the_replicated_limit(tmp_path):
    assert bench_replicas.deal(8, 3) == [3, 3, 2] and bench_replicas.deal(1, 3) == [1, 0, 0]
    plan = bench_replicas.plan(settings(tmp_path))
    limits = bench_replicas.limits(plan)
    assert [x.requests_ok for x in limits["replicas"]] == [2, 16, 64, 192, 256]
    sync, *_, top, _ = limits["replicas"]
    assert sync.itl_ms.p50 == pytest.approx(plan.profile.decode_s(1) * 1000)  # the profile's step at one row
    assert sync.duration_s == pytest.approx(2 * sync.latency_s.p50, rel=0.01)  # one after the other
    # 3 engines with 32 streams each are 3 single engines: P7's limit is 1
    (one,) = limits["single"]
    assert top.output_tokens_per_s == pytest.approx(3 * one.output_tokens_per_s, rel=0.01)


def test_published_rows_are_the_shared_file_s():
    if not SHARED_BENCHMARKS.exists():
        pytest.skip(f"{SHARED_BENCHMARKS} is not beside this checkout")
    text = SHARED_BENCHMARKS.read_text()
    heading = f"## {bench_replicas.PUBLISHED_HEADING}\n"
    assert heading in text
    table = text.split(heading, 1)[1].split("\n\n", 1)[0].splitlines()[2:]  # past the header and |---|
    rows = [tuple(cell.strip() for cell in line.strip("|").split("|")) for line in table]
    assert rows == [(r.server, r.mode, r.ttft, r.itl, r.tokens_per_s) for r in bench_replicas.PUBLISHED]


def test_p11_rows_are_the_shared_file_s():
    if not SHARED_BENCHMARKS.exists():
        pytest.skip(f"{SHARED_BENCHMARKS} is not beside this checkout")
    text = SHARED_BENCHMARKS.read_text()
    heading = f"## {bench_replicas.P11_HEADING}\n"
    assert heading in text
    section = text.split(heading, 1)[1].split("\n\n", 1)[0].splitlines()
    table = [line for line in section if line.startswith("|")][2:]  # past the Sources, the header and |---|
    rows = {tuple(cell.strip() for cell in line.strip("|").split("|")) for line in table}
    for x in bench_replicas.P11_PUBLISHED:
        assert (x.setup, x.load, x.tokens_per_s, x.ttft, x.itl) in rows
        assert str(x.users) in x.load and (x.replicas == 1) == (x.setup == "1 replica")
    assert [(x.tokens, x.ttft_ms, x.itl_ms) for x in bench_replicas.P11_PUBLISHED] == [
        (1144.5, 4600.0, 46.0),
        (426.0, 2140.0, 59.1),
    ]


def stage_of(tmp_path: Path, served_scale: float = 1.0, ttft_scale: float = 1.0) -> bench_replicas.Stage:
    """A stage whose served loads are its DES limits, tok/s x served_scale and TTFTs x ttft_scale."""
    plan = bench_replicas.plan(settings(tmp_path))
    limits = bench_replicas.limits(plan)
    runs = {}
    for name, replicas in (("single", 1), ("replicas", plan.replicas)):
        served = []
        for limit in limits[name]:
            x = copy.deepcopy(limit)
            x.output_tokens_per_s *= served_scale
            x.ttft_ms = replace(x.ttft_ms, p50=x.ttft_ms.p50 * ttft_scale)
            served.append(x)
        runs[name] = bench_replicas.ServerRun(name, replicas, plan.configs[name], served, limits[name])
    return bench_replicas.Stage(settings(tmp_path), plan, runs)


def test_p11_is_served_tok_s_over_the_published_vllm_figure(tmp_path):
    stage = stage_of(tmp_path, served_scale=0.5)
    many, one = stage.p11()
    _, served, limit = stage.runs["replicas"].find("concurrent@128")
    assert many.served is served and many.limit is limit
    assert many.value == pytest.approx(served.output_tokens_per_s / 1144.5)
    assert many.limit_value == pytest.approx(limit.output_tokens_per_s / 1144.5)
    _, served, _ = stage.runs["single"].find("concurrent@32 1 replica")
    assert one.value == pytest.approx(served.output_tokens_per_s / 426)
    assert many.label() == "P11 (3 replicas, 128 users)" and one.label() == "P11-single (1 replica, 32 users)"
    # the goal: tok/s at least the published and TTFT p50 at most the published
    assert many.met == (many.value >= 1.0 and many.served.ttft_ms.p50 <= 4600)
    line = many.line()
    assert "vLLM 1144.5" in line and "vs 4.6 s" in line and "vs 46.0 ms" in line and "DES limit" in line
    text = bench_replicas.report(stage)
    assert f"  {line}" in text and f"  {one.line()}" in text and bench_replicas.P11_SOURCE in text
    assert not any(re.match(r"P\d", x) for x in text.splitlines())  # the suite's ratio lines stay its own
    found = stage.to_dict()["p11"]
    assert [x["name"] for x in found] == [many.label(), one.label()]
    assert found[0]["value"] == pytest.approx(many.value) and found[0]["published_ttft_ms"] == 4600.0


def test_p11_goal_needs_both_throughput_and_ttft(tmp_path):
    stage = stage_of(tmp_path)
    many, _ = stage.p11()
    scale = 1144.5 / many.served.output_tokens_per_s
    fast = stage_of(tmp_path, served_scale=scale * 1.01, ttft_scale=1000 / max(many.served.ttft_ms.p50, 1e-9))
    assert fast.p11()[0].value > 1.0 and fast.p11()[0].met
    slow_ttft = stage_of(tmp_path, served_scale=scale * 1.01, ttft_scale=5000 / max(many.served.ttft_ms.p50, 1e-9))
    assert slow_ttft.p11()[0].value > 1.0 and not slow_ttft.p11()[0].met
    few = stage_of(tmp_path, served_scale=scale * 0.99, ttft_scale=1000 / max(many.served.ttft_ms.p50, 1e-9))
    assert not few.p11()[0].met


def test_p11_leaves_out_loads_that_were_not_run(tmp_path):
    plan = bench_replicas.plan(settings(tmp_path, levels=(1, 8)))
    limits = bench_replicas.limits(plan)
    runs = {
        name: bench_replicas.ServerRun(name, r, plan.configs[name], limits[name], limits[name])
        for name, r in (("single", 1), ("replicas", 3))
    }
    stage = bench_replicas.Stage(settings(tmp_path, levels=(1, 8)), plan, runs)
    assert [x.label() for x in stage.p11()] == ["P11-single (1 replica, 32 users)"]  # no 128-user load


def test_p12_is_served_ttft_p50_over_the_reference_s_at_p7_s_two_loads(tmp_path):
    stage = stage_of(tmp_path, ttft_scale=1.5)
    single, many = stage.p12()
    _, served, limit = stage.runs["single"].find("concurrent@32 1 replica")
    assert single.served is served and single.limit is limit
    assert single.value == pytest.approx(1.5) and not single.met
    _, served, _ = stage.runs["replicas"].find("concurrent@96")
    assert many.served is served and many.value == pytest.approx(1.5)
    assert single.label == "P12-single (1 replica, 32 streams)" and many.label == "P12 (3 replicas, 96 streams)"
    assert all(x.met for x in stage_of(tmp_path, ttft_scale=1.2).p12())
    text = bench_replicas.report(stage)
    assert f"  {single.line()}" in text and f"  {many.line()}" in text and "NOT met" in single.line()
    assert [x["value"] for x in stage.to_dict()["p12"]] == [pytest.approx(1.5), pytest.approx(1.5)]


# -- the suite with the stage, against stand-in servers -------------------------------------
def test_no_replicas_leaves_the_stage_out(tmp_path):
    from scripts.bench import suite as bench_suite

    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--no-replicas"]))
    assert setup.replicas is None
    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--long"]))
    assert setup.replicas is not None and setup.replicas.rounds == 8  # --long: 4 x the requests
    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--modes", "none"]))
    assert setup.modes == [] and setup.replicas is not None  # P8 and the stage only
