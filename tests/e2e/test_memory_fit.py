"""The memory-fit check through a real `make serve` (issue 22, item 4): the sim backend given
Llama-2-70B's config.json at tp_degree 2 refuses the layout at start, and `make serve` stops and
prints the worker's cause with the numbers (64.2 GiB of weights per NeuronCore against 16 GiB,
tests/unit/test_memory_model.py's arithmetic) and what would fit."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.make_checkout import free_ports, make_checkout, make_command

REPO = Path(__file__).resolve().parents[2]
NUMBERS = (
    "llama-2-70b bf16 at tp_degree 2, 8 slot(s) x 4096 positions: 64.2 GiB weights + 5.0 GiB KV + 1.0 GiB "
    "reserve = 70.2 GiB per NeuronCore > 16 GiB HBM; try tp_degree 24"
)


def test_make_serve_on_sim_refuses_a_70b_layout_on_two_cores(tiny_model_dir, tmp_path):
    if not has_secure_defaults():
        pytest.skip("make serve refuses TorchServe 0.11 (no token authorization)")
    checkout = make_checkout(tmp_path / "checkout")  # make serve writes logs/, build/ and key_file.json there
    config = yaml.safe_load((REPO / "configs" / "model-config-sim.yaml").read_text())
    config["handler"].update(tp_degree=2, amp="bf16")
    config["handler"]["sim"].update(
        profile=str(REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"),
        hf_config=str(REPO / "tests" / "fixtures" / "configs" / "llama-2-70b.json"),
        time_scale=0.0,
    )
    (checkout / "sim-70b-tp2.yaml").write_text(yaml.safe_dump(config))
    make = make_command()
    ports = [f"{name}={port}" for name, port in free_ports().items()]
    command = [*make, "serve", f"MODEL_DIR={tiny_model_dir}", "MODEL_CONFIG=sim-70b-tp2.yaml", "DRAIN_GRACE_S=0"]
    t0 = time.perf_counter()
    try:
        done = subprocess.run(
            [*command, *ports], cwd=checkout, capture_output=True, text=True, timeout=300, env={**os.environ}
        )
    finally:  # never leave it running, whatever happened
        subprocess.run([*make, "stop", "DRAIN_GRACE_S=0"], cwd=checkout, capture_output=True, timeout=120)
    output = done.stdout + done.stderr
    print(f"\nmake serve failed after {time.perf_counter() - t0:.1f} s; its last lines:\n" + output[-1500:])
    assert done.returncode != 0
    assert "the model failed to load" in output
    assert "backend sim: this layout does not fit in a NeuronCore's memory" in output
    assert NUMBERS in output
