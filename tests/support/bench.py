from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
PROFILE_7B = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
PROFILE_13B = REPO / "profiles" / "llama-2-13b-inf2-48xl-tp24.yaml"


def sim_model_yaml(model_dir: Path, micro_batch_size: int = 8, **sim: Any) -> dict[str, Any]:
    """Static mode (micro_batch_size rows per micro-batch, the profile's 8 slots)."""
    return {
        "batchSize": 8,
        "scheduler": {"mode": "static", "n_slots": 8},
        "handler": {
            "model_checkpoint_dir": str(model_dir),
            "backend": "sim",
            "n_positions": 4096,
            "max_new_tokens": 1024,
            "sim": {"profile": str(PROFILE_7B), "time_scale": 0.0, **sim},
        },
        "micro_batching": {"micro_batch_size": micro_batch_size},
    }


class FakeClock:
    """Records what the simulated model charges instead of sleeping."""

    def __init__(self) -> None:
        self.t = 0.0
        self.charged: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep_until(self, deadline: float) -> None:
        self.charged.append(round(deadline - self.t, 9))
        self.t = max(self.t, deadline)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


# P9's own line (scripts/bench/constrained.py) and its line in the suite's ratios
P9_LINE = re.compile(r"P9 = \d+\.\d{3} ms / \d+\.\d\d ms = \d+\.\d{4} goal <= 0\.05 (met|missed)( \(.+\))?")
SUITE_LINE = re.compile(r"P9 \d+\.\d\d  goal <= 0\.05 (met|NOT met)  = .+ / .+")
