"""The bench end to end on a tiny load: a real torchserve with the sim backend, well-formed
results. Figures are not asserted (they are benchmark numbers, not pass/fail)."""

import json
import math
import re
import subprocess
import sys

import pytest

from tests.bench.conftest import REPO


@pytest.mark.e2e
@pytest.mark.timeout(240)
def test_bench_suite_runs_a_tiny_load_and_writes_well_formed_results(tiny_model_dir, tmp_path):
    out = tmp_path / "result"
    cmd = [sys.executable, str(REPO / "scripts" / "bench_suite.py"), "--model-dir", str(tiny_model_dir)]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--no-progress", "--time-scale", "0.5"]
    cmd += ["--sync-requests", "2", "--concurrent-rounds", "1", "--poisson-requests", "6", "--output-tokens", "12"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    last = proc.stdout.strip().splitlines()[-3:]
    assert [line.split()[0] for line in last] == ["P1", "P2", "P3"]
    assert all(re.fullmatch(r"P\d \d+\.\d\d", line) for line in last)
    assert "TTFT ms p50/p90/p99" in proc.stdout

    result = json.loads(out.with_suffix(".json").read_text())
    loads = {load["kind"]: load for load in result["loads"]}
    assert set(loads) == {"synchronous", "concurrent", "poisson"}
    assert [loads[k]["requests_ok"] for k in ("synchronous", "concurrent", "poisson")] == [2, 8, 6]
    for load in loads.values():
        assert load["requests_failed"] == 0
        assert all(r["completion_tokens"] == 12 for r in load["requests"])
        for key in ("ttft_ms", "itl_ms", "latency_s"):
            assert set(load[key]) == {"p50", "p90", "p99", "mean"}
            assert all(math.isfinite(v) and v > 0 for v in load[key].values())
        assert load["output_tokens_per_s"] > 0 and load["requests_per_s"] > 0
    assert loads["poisson"]["rate"] > 0
    assert set(result["meta"]["ratios"]) == {"P1", "P2", "P3"}
    assert result["meta"]["reference"]["step_1_ms"] == pytest.approx(6.47)
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    server_out = (tmp_path / "work" / "sim" / "torchserve.out").read_text()
    assert "StatusLogger" not in server_out, server_out[:2000]  # serving/log4j2.xml was accepted
    assert (tmp_path / "work" / "sim" / "logs" / "ts_log.log").exists()


def test_bare_backend_reference_measures_hf_generate(tiny_model_dir):
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_backend import reference
    from bench_suite import hf_model_config

    config = hf_model_config(2)
    config["handler"]["model_checkpoint_dir"] = str(tiny_model_dir)
    ref = reference(config, tiny_model_dir, prompt_tokens=8, output_tokens=6, repeats=1)
    assert ref["backend"] == "hf" and ref["batch_size"] == 2
    assert ref["measured"]["batch_2"]["steps"] == 6
    assert ref["generate_tokens_per_s"] > 0 and ref["step_1_ms"] > 0
