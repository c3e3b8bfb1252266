"""The bench's replicas stage run: the whole suite with the stage against stand-in servers (no
torchserve), and the stage itself on real torchservers at a tiny scale. Benchmark figures are
not asserted, only their shape and how P7 follows from the two loads."""

import json
import math
import re

import pytest

from scripts.bench import replicas as bench_replicas

P_LINE = re.compile(r"P\d[a-z-]* \d+\.\d\d  goal [<>]= [\d.]+ (met|NOT met)  = .+ / .+")


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
    from handler.backends.sim_profile import load_profile
    from scripts.bench import des
    from scripts.bench import suite as bench_suite

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
    assert ours == ["synchronous", "concurrent@8", "concurrent@32", "concurrent@96", "concurrent@128"]
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


# -- the stage on real torchservers, tiny --------------------------------------------------
@pytest.mark.timeout(420)
def test_stage_on_torchserve_at_a_tiny_scale(tiny_model_dir, tmp_path):
    """1 replica at B = 2 streams, then 3 replicas at 1 and 6 streams: short prompts, 6 new
    tokens, every sleep x 0.05."""
    from scripts.bench import suite as bench_suite

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
