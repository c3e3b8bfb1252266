"""scripts/bench/encoder_placement.py runs both placements on the fake's device-time model and prints
one row per placement and batch (no timing is asserted: the figures go to docs/embeddings.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_the_placement_benchmark_prints_both_placements_per_batch():
    command = [sys.executable, "-m", "scripts.bench.encoder_placement", "--duration", "0.3", "--callers", "2"]
    out = subprocess.run(command + ["--batches", "1", "4"], cwd=REPO, capture_output=True, text=True, check=True)
    rows = [
        line.split()
        for line in out.stdout.splitlines()
        if line.split()[0] in ("dataparallel", "per-core") and "/" not in line
    ]
    assert [(r[0], r[1]) for r in rows] == [
        ("dataparallel", "1"),
        ("per-core", "1"),
        ("dataparallel", "4"),
        ("per-core", "4"),
    ]
    assert all(float(r[2]) > 0 for r in rows)
    assert "per-core / dataparallel at batch 4:" in out.stdout
