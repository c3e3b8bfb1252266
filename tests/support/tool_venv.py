"""Client tools with large dependency trees (guidellm, lm-eval) live in venvs of their own
under `.venv/` (`make guidellm`, `make lm-eval`); a test installs one itself if make has not."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def tool_bin(venv_name: str, requirements: str, executable: str) -> Path:
    """`.venv/<venv_name>/bin/<executable>`, installing the venv from `requirements` first if needed:
    when it is missing, or `requirements` changed since (as make's rule for it does)."""
    venv = REPO / ".venv" / venv_name
    marker = venv / ".installed"
    if not marker.exists() or marker.stat().st_mtime < (REPO / requirements).stat().st_mtime:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "-r", str(REPO / requirements)], check=True)
        marker.touch()
    return venv / "bin" / executable
