"""The tier check itself (tests/tiers.py): a test outside e2e/perf cannot start a server."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiers import TESTS, starts_a_server, tier_of


@pytest.mark.parametrize(
    ("argv", "server"),
    [
        (["/venv/bin/torchserve", "--start", "--ncs", "--ts-config", "c.properties"], True),
        (["make", "-s", "serve", "MODEL_DIR=m"], True),
        (["/venv/bin/torchserve", "--stop"], False),
        (["make", "-s", "archive"], False),
        ([sys.executable, "-c", "pass"], False),
        ("torchserve --start --ncs", True),
    ],
)
def test_a_server_start_is_recognised(argv, server):
    assert starts_a_server(argv) is server


def test_the_tier_is_the_top_folder_under_tests():
    assert tier_of(TESTS / "e2e" / "openai" / "test_x.py") == "e2e"
    assert tier_of(TESTS / "unit" / "test_x.py") == "unit"
    assert tier_of(TESTS / "real_model" / "test_x.py") == "real_model"
    assert tier_of(TESTS / "fakes" / "x.py") is None
    assert tier_of(Path("/elsewhere/test_x.py")) is None


def test_this_unit_test_may_not_start_torchserve(tmp_path: Path):
    with pytest.raises(RuntimeError, match="move it to tests/e2e"):
        subprocess.run([str(tmp_path / "torchserve"), "--start"], check=False)


def test_it_may_run_other_programs(request: pytest.FixtureRequest):
    assert request.node.get_closest_marker("unit") is not None
    assert subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout == "1\n"
