"""guidellm lives in its own venv (`.venv/guidellm`, `make guidellm`): it brings a large
dependency tree (datasets, sanic, pyarrow) the serving venv does not need."""

from __future__ import annotations

from pathlib import Path

from tests.support.tool_venv import tool_bin


def guidellm_bin() -> Path:
    """The guidellm executable, installing its venv first if `make guidellm` has not."""
    return tool_bin("guidellm", "requirements-guidellm.txt", "guidellm")
