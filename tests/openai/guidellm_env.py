"""guidellm lives in its own venv (`.venv/guidellm`, `make guidellm`): it brings a large
dependency tree (datasets, sanic, pyarrow) the serving venv does not need."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv" / "guidellm"
REQUIREMENTS = REPO / "requirements-guidellm.txt"
MARKER = VENV / ".installed"


def guidellm_bin() -> Path:
    """The guidellm executable, installing its venv first if `make guidellm` has not."""
    if not MARKER.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
        MARKER.touch()
    return VENV / "bin" / "guidellm"
