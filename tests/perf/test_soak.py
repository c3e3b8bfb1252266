"""The soak in short: one minute of `make soak` (scripts/bench/soak.py) against its own torchserve.

The sim backend at 70 % of capacity (one model copy, and two replicas behind the one worker),
native and OpenAI routes, streamed and not, 10 % of the
clients leaving mid-stream and 1 % invalid requests. It fails on any valid request lost
(a connection error, a timeout, a 5xx, an end without finish_reason), any invalid request
not refused with a 4xx JSON error, or a slot or waiting request left in the engine once the
load has drained (the handler's gauges, scraped from Prometheus).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOAK_MINUTES = 1.0


@pytest.mark.timeout(400)
@pytest.mark.parametrize("replicas", [1, 2], ids=["one-copy", "two-replicas"])
def test_a_minute_of_mixed_load_loses_nothing_and_leaks_no_slot(
    replicas: int, tiny_model_dir: Path, tmp_path: Path, request
):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, "-m", "scripts.bench.soak", "--minutes", str(SOAK_MINUTES)]
    cmd += ["--replicas", str(replicas)]
    cmd += ["--model-dir", str(tiny_model_dir), "--workdir", str(tmp_path / "ts"), "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=360, cwd=REPO)
    print(proc.stdout)
    if proc.returncode != 0 and (tmp_path / "ts" / "logs").exists():
        import shutil

        dest = request.config.rootpath / "build" / "test-logs" / f"soak-{replicas}"
        shutil.copytree(tmp_path / "ts" / "logs", dest, dirs_exist_ok=True)
    assert out.exists(), proc.stderr[-3000:]
    report = json.loads(out.read_text())
    counts = report["counts"]
    assert counts["lost"] == 0, counts["lost_by_error"]
    assert counts["invalid_answered_otherwise"] == 0, counts["invalid_by_answer"]
    assert report["slots_after_drain"] == {"llm_slots_occupied": 0.0, "llm_requests_waiting": 0.0}
    # The mix really was mixed: every route and both shapes, clients that left, invalid bodies.
    assert all(n > 0 for n in counts["by_route"].values()), counts["by_route"]
    assert counts["cancelled"] > 0 and counts["invalid_refused_4xx_json"] > 0, counts
    assert counts["completed"] + counts["cancelled"] == counts["valid_sent"]
    assert report["worker_rss"]["max_mb"], "the worker's RSS was never sampled"
    assert report["config"]["scheduler"].get("replicas", 1) == replicas
    assert proc.returncode == 0, proc.stderr[-3000:]
