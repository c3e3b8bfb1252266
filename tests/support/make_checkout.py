"""A scratch copy of what `make serve` needs, for the tests that run the real Makefile: it writes
logs/, build/, model_store/ and key_file.json where it runs, so it must not run in the repository."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from tests.support.torchserve_process import free_port

REPO = Path(__file__).resolve().parents[2]
# The Makefile, what its targets run, and `make venv`'s prerequisites (the venv is passed in and kept).
COPIED = (
    "Makefile",
    "mk",
    "handler",
    "scripts",
    "serving",
    "profiles",
    "configs",
    "model-config.yaml",
    "requirements.txt",
    "requirements-dev.txt",
)


def make_checkout(dest: Path) -> Path:
    dest.mkdir()
    for name in COPIED:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(REPO / name, dest / name)
    return dest


def make_command() -> list[str]:
    """`make` with this test run's venv, never reinstalled."""
    venv = Path(sys.prefix)
    return ["make", "--no-print-directory", "-o", f"{venv}/.installed", f"VENV={venv}"]


def free_ports() -> dict[str, int]:
    """Every port `make serve` opens, each a free one."""
    names = ("INFERENCE_PORT", "MANAGEMENT_PORT", "METRICS_PORT", "GRPC_INFERENCE_PORT", "GRPC_MANAGEMENT_PORT")
    return {name: free_port() for name in names}
