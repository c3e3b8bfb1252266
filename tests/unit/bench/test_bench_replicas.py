"""The bench's replicas stage (scripts/bench_replicas.py): its plan and limits, the published
rows against shared/inf2-benchmarks.md, the whole suite with the stage against stand-in servers
(no torchserve), and the stage itself on real torchservers at a tiny scale (e2e). Benchmark
figures are not asserted, only their shape and how P7 follows from the two loads."""

import json
import math
import re
import sys
from pathlib import Path

import pytest

from tests.support.bench import PROFILE_7B, REPO

sys.path.insert(0, str(REPO / "scripts"))

import bench_replicas

P_LINE = re.compile(r"P\d[a-z-]* \d+\.\d\d  goal [<>]= [\d.]+ (met|NOT met)  = .+ / .+")
SHARED_BENCHMARKS = REPO.parent / "shared" / "inf2-benchmarks.md"


def settings(tmp_path: Path, **kw) -> bench_replicas.Settings:
    return bench_replicas.Settings(model_dir=REPO / "models" / "tiny-llama", workdir=tmp_path, **kw)


def test_plan_of_the_shipped_3x_tp8_layout(tmp_path):
    plan = bench_replicas.plan(settings(tmp_path))
    assert (plan.replicas, plan.n_slots, plan.streams) == (3, 32, 32)
    assert [x.name for x in plan.loads["replicas"]] == ["synchronous", "concurrent@8", "concurrent@32", "concurrent@96"]
    assert [(x.streams, x.requests) for x in plan.loads["replicas"]] == [(1, 2), (8, 16), (32, 64), (96, 192)]
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
    assert [x.requests_ok for x in limits["replicas"]] == [2, 16, 64, 192]
    sync, *_, top = limits["replicas"]
    assert sync.itl_ms.p50 == pytest.approx(24.5)  # the profile's step at one row
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


# -- the suite with the stage, against stand-in servers -------------------------------------
class _StandIn:
    """A server that answers each load with the discrete-event model, `slower` x the profile's
    times, and whose metrics report a decode step of `step_s` per step."""

    url, model_name, headers = "http://stand-in", "llama", {}

    def __init__(self, config: dict, slower: float, step_s: float) -> None:
        self.config, self.slower, self.step_s, self.steps = config, slower, step_s, 0

    def scrape_metrics(self) -> str:
        self.steps += 100
        return f"llm_decode_step_seconds_sum {self.steps * self.step_s}\nllm_decode_step_seconds_count {self.steps}\n"

    def stop(self) -> None:
        pass


def test_suite_prints_and_writes_p7_against_stand_in_servers(tmp_path, monkeypatch, capsys):
    import bench_des as des
    import bench_suite

    from handler.backends.sim_profile import load_profile

    servers: list[_StandIn] = []

    def start(workdir, model_dir, config, **_):
        replicas = config["scheduler"].get("replicas", 1)
        # the suite's own modes as they are; the 3 replicas 10 % slower than the one, with longer steps
        slower, step_s = (1.1, 0.066) if replicas > 1 else (1.0, 0.060)
        servers.append(_StandIn(config, slower, step_s))
        return servers[-1]

    async def run_all(target, loads, workload, sweep_streams):
        server = servers[-1]
        config = server.config
        profile = des.scaled(load_profile(config["handler"]["sim"]["profile"]), server.slower)
        scheduler = config["scheduler"]
        if "replicas" in scheduler:  # the replicas stage's servers
            shape = des.Shape(1500, 250, 150)
            budget, replicas = scheduler["prefill_token_budget"], scheduler["replicas"]
            return [
                bench_replicas.replicated_limit(profile, scheduler["n_slots"], budget, x, shape, replicas)
                for x in loads
            ]
        policy = des.Policy(scheduler["mode"], scheduler["n_slots"], max_batch_delay_s=config["maxBatchDelay"] / 1000)
        shape = des.Shape(100, 128, 10, seed=7)
        return [des.run(profile, policy, des.Load(x.kind, x.requests, x.streams, x.rate), shape, x.name) for x in loads]

    real_measure = bench_suite.bench_sampling.measure
    monkeypatch.setattr(bench_suite, "run_all", run_all)
    monkeypatch.setattr(bench_replicas, "run_all", run_all)
    monkeypatch.setattr(bench_suite.bench_server, "start", start)
    monkeypatch.setattr(bench_suite.bench_sampling, "measure", lambda **_: real_measure(1, 1, flat=False))
    monkeypatch.setattr(bench_suite, "PromptMaker", lambda *a, **k: None)
    monkeypatch.setattr(bench_replicas, "PromptMaker", lambda *a, **k: None)
    out = tmp_path / "bench-sim"
    argv = ["--out", str(out), "--workdir", str(tmp_path), "--des-requests", "200", "--no-progress", "--no-constrained"]
    bench_suite.main(argv + ["--modes", "continuous", "--sweep", "none", "--no-sampled"])

    text = capsys.readouterr().out
    ratios = [line for line in text.splitlines() if re.match(r"P\d", line)]
    assert [line.split()[0] for line in ratios] == ["P1", "P2", "P3", "P7", "P8a", "P8a-greedy", "P8b", "P8b-greedy"]
    assert text.strip().splitlines()[-len(ratios) :] == ratios  # the ratios last, as before
    assert all(P_LINE.fullmatch(line) for line in ratios)
    (p7_line,) = [line for line in ratios if line.startswith("P7 ")]
    assert (
        "NOT met" in p7_line and "(3 replicas, 96 streams) / 3 x " in p7_line and "(1 replica, 32 streams)" in p7_line
    )
    # the servers: continuous, then the stage's 1 replica and 3 replicas
    assert [s.config["scheduler"].get("replicas") for s in servers] == [None, 1, 3]

    # the seed table: one simulated row per level, the four published rows and their source
    ours = [line.split()[2] for line in text.splitlines() if line.startswith("ours (simulated)")]
    assert ours == ["synchronous", "concurrent@8", "concurrent@32", "concurrent@96"]
    assert sum(line.endswith("(published)") or "(published) " in line for line in text.splitlines()) == 4
    assert bench_replicas.PUBLISHED_SOURCE in text
    # P7 is low here: its per-step host time is printed with it, and says the steps were longer
    assert "per-step host time over P7's loads" in text
    assert "llm_decode_step_seconds 66.00 ms" in text and "llm_decode_step_seconds 60.00 ms" in text
    assert "P7 is below its goal: decode step 66.0 ms with 3 replicas against 60.0 ms with one" in text

    result = json.loads(out.with_suffix(".json").read_text())
    stage = result["replicas"]
    loads = {name: {x["name"]: x for x in run["loads"]} for name, run in stage["runs"].items()}
    many = loads["replicas"]["concurrent@96"]["output_tokens_per_s"]
    one = loads["single"]["concurrent@32 1 replica"]["output_tokens_per_s"]
    assert stage["p7"]["value"] == pytest.approx(many / (3 * one))
    assert result["meta"]["ratios"]["P7"] == pytest.approx(stage["p7"]["value"])
    assert stage["p7"]["value"] == pytest.approx(1 / 1.1, rel=0.02)  # the stand-in's 10 %
    assert stage["p7"]["limit"] == pytest.approx(1.0, rel=0.01)
    assert stage["p7_handler_metrics_mean_s"]["replicas"]["llm_decode_step_seconds"] == pytest.approx(0.066)
    assert [x["name"] for x in stage["runs"]["replicas"]["limits"]] == list(loads["replicas"])
    assert len(stage["published"]) == 4 and stage["published_source"] == bench_replicas.PUBLISHED_SOURCE


def test_no_replicas_leaves_the_stage_out(tmp_path):
    import bench_suite

    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--no-replicas"]))
    assert setup.replicas is None
    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--long"]))
    assert setup.replicas is not None and setup.replicas.rounds == 8  # --long: 4 x the requests
    setup = bench_suite.set_up(bench_suite.parse_args(["--workdir", str(tmp_path), "--modes", "none"]))
    assert setup.modes == [] and setup.replicas is not None  # P8 and the stage only


# -- the stage on real torchservers, tiny --------------------------------------------------
@pytest.mark.timeout(420)
def test_stage_on_torchserve_at_a_tiny_scale(tiny_model_dir, tmp_path):
    """1 replica at B = 2 streams, then 3 replicas at 1 and 6 streams: short prompts, 6 new
    tokens, every sleep x 0.05."""
    import bench_suite

    s = bench_replicas.Settings(
        model_dir=tiny_model_dir,
        workdir=tmp_path / "work",
        levels=(1,),
        rounds=1,
        streams=2,
        prompt_tokens=40,
        prompt_spread=0,
        output_tokens=6,
        time_scale=0.05,
        progress=False,
    )
    stage = bench_replicas.run_stage(s)

    many, one = stage.runs["replicas"], stage.runs["single"]
    assert [x.name for x in many.served] == ["synchronous", "concurrent@6"]
    assert [x.name for x in one.served] == ["concurrent@2 1 replica"]
    for load, streams in zip(one.served + many.served, (2, 1, 6), strict=True):
        assert load.streams == streams and load.requests_ok == streams and load.requests_failed == 0, load.errors
        assert all(r["completion_tokens"] == 6 for r in load.requests)
        assert all(abs(r["prompt_tokens"] - 40) <= 8 for r in load.requests), [
            r["prompt_tokens"] for r in load.requests
        ]
    assert len(many.scrapes) == 3 and "llm_decode_step_seconds_sum" in many.scrapes[-1]

    ratio = bench_suite.p7(stage)
    top = many.served[-1].output_tokens_per_s
    assert ratio.value > 0 and math.isfinite(ratio.value)
    assert ratio.value == pytest.approx(top / (3 * one.served[0].output_tokens_per_s))
    assert P_LINE.fullmatch(ratio.line())
    metrics = bench_suite.p7_host_metrics(stage)
    assert metrics["replicas"]["llm_decode_step_seconds"] > 0 and metrics["single"]["llm_decode_step_seconds"] > 0

    text = bench_replicas.report(stage)
    assert [line.split()[2] for line in text.splitlines() if line.startswith("ours (simulated)")] == [
        "synchronous",
        "concurrent@6",
    ]
    assert "not comparable with the published rows" in text  # time scale 0.05
    result = json.loads(json.dumps(stage.to_dict()))
    assert result["p7"]["value"] == pytest.approx(ratio.value)
    assert result["runs"]["replicas"]["config"]["scheduler"]["replicas"] == 3
    assert result["runs"]["single"]["config"]["scheduler"]["replicas"] == 1
    for mode in ("single", "replicas"):
        server_out = (tmp_path / "work" / mode / "torchserve.out").read_text()
        assert "StatusLogger" not in server_out, server_out[:2000]
