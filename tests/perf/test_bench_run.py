"""The bench end to end: a real torchserve with the sim backend in both scheduler modes on a
tiny load (e2e), the hf suite on the tiny model (P5-single, P5, idle TTFT, the worker's RSS),
the in-process hf reference through bench_backend.py's CLI, and the whole
suite against a stand-in server that answers with the discrete-event model (no torchserve).
Figures are not asserted where they are benchmark numbers, only their shape."""

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.support.bench import REPO

P_LINE = re.compile(r"P\d[a-z-]* \d+\.\d\d  goal [<>]= [\d.]+ (met|NOT met)  = .+ / .+")
RATIOS = ["P1", "P2", "P3", "P4", "P2s", "P8a", "P8a-greedy", "P8b", "P8b-greedy"]


def check_mode_results(mode: dict, counts: list[int], output_tokens: int) -> None:
    loads = mode["loads"]
    assert [load["kind"] for load in loads] == ["synchronous", "concurrent", "poisson", "poisson"]
    assert [load["requests_ok"] for load in loads] == counts
    for load in loads:
        assert load["requests_failed"] == 0
        assert all(r["completion_tokens"] == output_tokens for r in load["requests"])
        for key in ("ttft_ms", "itl_ms", "latency_s"):
            assert set(load[key]) == {"p50", "p90", "p99", "mean"}
            assert all(math.isfinite(v) and v > 0 for v in load[key].values())
        assert load["output_tokens_per_s"] > 0 and load["requests_per_s"] > 0
    assert [load["requests_ok"] for load in mode["limits"]] == counts
    assert [p["fraction"] for p in mode["sweep"]] == pytest.approx([0.5, 0.7])


@pytest.mark.timeout(480)
def test_bench_suite_runs_both_modes_on_a_tiny_load(tiny_model_dir, tmp_path):
    out = tmp_path / "result"
    cmd = [sys.executable, "-m", "scripts.bench.suite", "--model-dir", str(tiny_model_dir)]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--no-progress", "--time-scale", "0.5"]
    cmd += ["--sync-requests", "2", "--concurrent-rounds", "1", "--poisson-requests", "6", "--output-tokens", "12"]
    cmd += ["--sweep", "0.5", "--sweep-min-requests", "3", "--sweep-seconds", "0.01", "--des-requests", "200"]
    cmd += ["--no-replicas", "--no-constrained"]  # P7's and P9's stages have their own tests
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=460, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    last = proc.stdout.strip().splitlines()[-len(RATIOS) :]
    assert [line.split()[0] for line in last] == RATIOS
    assert all(P_LINE.fullmatch(line) for line in last), last
    assert all("(per-slot sampler: " in line for line in last[4:])  # P2s and P8 with the old sampler's figure
    assert "TTFT ms p50/p90/p99" in proc.stdout and "limit TTFT" in proc.stdout
    assert "host sampling per step" in proc.stdout and "llm_step_sampling_seconds" in proc.stdout

    result = json.loads(out.with_suffix(".json").read_text())
    assert set(result["modes"]) == {"continuous", "static"}
    for mode in result["modes"].values():
        check_mode_results(mode, [2, 8, 6, 6], 12)
    continuous = result["modes"]["continuous"]["config"]
    assert continuous["continuousBatching"] is True and continuous["scheduler"]["mode"] == "continuous"
    assert "continuousBatching" not in result["modes"]["static"]["config"]
    meta = result["meta"]
    assert set(meta["ratios"]) == set(RATIOS)
    sampled = result["modes"]["continuous"]
    for key in ("sampled", "sampled_per_slot"):  # P2s's loads: every request sampled, both samplers
        assert sampled[key]["requests_ok"] == 8 and sampled[key]["requests_failed"] == 0
    assert meta["reference"]["step_1_ms"] == pytest.approx(6.47 / 2)
    assert meta["capacity_req_per_s"] > 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for mode in ("continuous", "static", "per-slot"):
        server_out = (tmp_path / "work" / "sim" / mode / "torchserve.out").read_text()
        assert "StatusLogger" not in server_out, server_out[:2000]  # serving/log4j2.xml was accepted
        assert (tmp_path / "work" / "sim" / mode / "logs" / "ts_log.log").exists()


@pytest.mark.timeout(300)
def test_bench_suite_hf_serves_the_model_dir_and_prints_p5_ttft_and_rss(tiny_model_dir, tmp_path):
    """`make bench BACKEND=hf` on a tiny load: the model of --model-dir is the one served, and the
    report ends with the idle TTFT, the worker's RSS, P5-single and P5."""
    out = tmp_path / "result"
    cmd = [sys.executable, "-m", "scripts.bench.suite", "--backend", "hf", "--model-dir", str(tiny_model_dir)]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--no-progress"]
    cmd += ["--sync-requests", "3", "--concurrent-rounds", "1", "--prompt-tokens", "16", "--prompt-spread", "2"]
    cmd += ["--output-tokens", "8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    lines = proc.stdout.strip().splitlines()
    ttft, rss, single, batch = lines[-4:]
    assert re.fullmatch(r"idle TTFT p50 \d+\.\d ms \(one stream, 3 requests, prompts 16±2 tokens\)", ttft), ttft
    assert re.fullmatch(r"worker RSS peak \d+ MiB, \d+ MiB after the loads \(.+\)", rss), rss
    assert P_LINE.fullmatch(single) and single.startswith("P5-single ") and "(1 stream) / " in single, single
    assert P_LINE.fullmatch(batch) and batch.startswith("P5 ") and "(4 streams) / " in batch, batch
    assert "in-process" in single and "(batch 1)" in single and "(batch 4)" in batch
    assert f"hf: {tiny_model_dir.name} on CPU, 4 slots" in proc.stdout

    result = json.loads(out.with_suffix(".json").read_text())
    meta, continuous = result["meta"], result["modes"]["continuous"]
    assert set(meta["ratios"]) == {"P5-single", "P5"}
    by_batch = meta["reference"]["tokens_per_s_by_batch"]
    assert set(by_batch) == {"1", "4"} and all(v > 0 for v in by_batch.values())
    assert len(meta["reference"]["tokens_per_s_runs"]) == 2  # before and after the served loads
    assert meta["ratios"]["P5"] == pytest.approx(continuous["loads"][1]["output_tokens_per_s"] / by_batch["4"])
    assert meta["ratios"]["P5-single"] == pytest.approx(continuous["loads"][0]["output_tokens_per_s"] / by_batch["1"])
    # the worker is a Python process with torch and the model loaded: well over 100 MiB
    assert continuous["worker_rss_mib"]["peak"] >= continuous["worker_rss_mib"]["after_loads"] > 100
    assert [load["requests_ok"] for load in continuous["loads"]] == [3, 4]
    for load in continuous["loads"]:
        assert load["requests_failed"] == 0
        assert all(r["completion_tokens"] == 8 for r in load["requests"])  # EOS ignored: the full count
    # the archive serves the model given (stage_archive writes its absolute path), with one thread for the model
    staged = yaml.safe_load(
        (tmp_path / "work" / "hf" / "continuous" / "model_store" / "llama" / "model-config.yaml").read_text()
    )
    assert Path(staged["handler"]["model_checkpoint_dir"]).resolve() == tiny_model_dir.resolve()
    assert staged["handler"]["backend"] == "hf" and staged["handler"]["cpu_threads"] == 1


def test_in_process_reference_for_hf_through_the_cli(tiny_model_dir, tmp_path):
    from scripts.bench.suite import backend_reference, hf_model_config

    ref = backend_reference(hf_model_config(2), tiny_model_dir, tmp_path, prompt_tokens=8, output_tokens=6, repeats=1)
    assert ref["backend"] == "hf" and ref["batch_size"] == 2
    assert ref["generate_tokens_per_s"] > 0 and ref["step_1_ms"] > 0


class _StandIn:
    """A server stand-in: each load is answered by the discrete-event model of the
    configured mode on a profile 3 % slower (a stand-in for serving overhead)."""

    url, model_name, headers = "http://stand-in", "llama", {}

    def __init__(self, config: dict) -> None:
        self.config = config

    def scrape_metrics(self) -> str:
        return "llm_time_to_first_token_seconds_sum 1.0\nllm_time_to_first_token_seconds_count 4.0\n"

    def stop(self) -> None:
        pass


def test_suite_end_to_end_against_a_stand_in_server(tmp_path, monkeypatch, capsys):
    from handler.backends.sim_profile import load_profile
    from scripts.bench import des
    from scripts.bench import suite as bench_suite

    started: list[dict] = []
    entries: list = []

    def start(workdir, model_dir, config, handler=None):
        started.append(config)
        entries.append(handler)
        return _StandIn(config)

    async def run_all(target, loads, workload, sweep_streams):
        config = started[-1]
        profile = des.scaled(load_profile(config["handler"]["sim"]["profile"]), 1.03)  # 3 % overhead
        kind = config["scheduler"]["mode"]
        policy = des.Policy(kind, config["scheduler"]["n_slots"], max_batch_delay_s=config["maxBatchDelay"] / 1000)
        shape = des.Shape(100, 128, 10, seed=7)
        return [des.run(profile, policy, des.Load(x.kind, x.requests, x.streams, x.rate), shape, x.name) for x in loads]

    real_measure = bench_suite.bench_sampling.measure
    monkeypatch.setattr(bench_suite, "run_all", run_all)
    monkeypatch.setattr(bench_suite.bench_server, "start", start)
    monkeypatch.setattr(bench_suite.bench_sampling, "measure", lambda **_: real_measure(1, 1, flat=False))
    monkeypatch.setattr(bench_suite, "PromptMaker", lambda *a, **k: None)
    out = tmp_path / "bench-sim"
    argv = [
        "--out",
        str(out),
        "--workdir",
        str(tmp_path),
        "--des-requests",
        "500",
        "--no-progress",
        "--no-replicas",
        "--no-constrained",
    ]
    bench_suite.main(argv)

    text = capsys.readouterr().out
    lines = text.strip().splitlines()
    assert [line.split()[0] for line in lines[-len(RATIOS) :]] == RATIOS
    assert all(P_LINE.fullmatch(line) for line in lines[-len(RATIOS) :])
    assert "capacity 4.552 req/s" in text and "knee:" in text
    # continuous, P2s's per-slot baseline (the same config, the bench's entry point), then static
    assert [c["scheduler"]["mode"] for c in started] == ["continuous", "continuous", "static"]
    assert started[1] == started[0]
    assert entries == [None, REPO / "scripts" / "bench" / "per_slot_sampler.py", None]
    assert started[0]["continuousBatching"] is True and started[0]["batchSize"] == 16

    result = json.loads(out.with_suffix(".json").read_text())
    meta = result["meta"]
    assert meta["ratios"]["P1"] == pytest.approx(1.03)
    assert meta["ratios"]["P2"] == pytest.approx(1 / 1.03, rel=0.01)
    assert meta["ratios"]["P4"] > 10
    assert meta["ratios"]["P2s"] == pytest.approx(meta["ratios"]["P2"])  # the stand-in has no host cost
    details = {d["name"]: d for d in meta["ratio_details"]}
    assert all(details[name]["baseline"] > 0 for name in ("P2s", "P8a", "P8b", "P8a-greedy", "P8b-greedy"))
    assert meta["knees"]["served"]["static"]["p50"] == pytest.approx(0.3)
    assert meta["policy_reference_des"]["capacity_req_per_s"] == pytest.approx(4.552, abs=0.001)
    for mode in result["modes"].values():
        assert [p["fraction"] for p in mode["sweep"]] == pytest.approx([0.1, 0.3, 0.5, 0.7, 0.85, 0.95])
        assert len(mode["limits"]) == len(mode["loads"]) == 8
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
