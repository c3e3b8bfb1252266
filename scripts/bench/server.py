"""The benchmark's own torchserve: scripts/serve/local_torchserve.py (private temp dir, free ports,
quiet log config, `make serve`'s serving/local.properties with Prometheus metrics mode on), so
the handler's token metrics can be scraped after the loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scripts.serve.local_torchserve import TorchServe, start_torchserve


def start(
    workdir: Path,
    model_dir: Path,
    model_config: dict[str, Any],
    model_name: str = "llama",
    timeout: float = 180,
    handler: Path | None = None,
) -> TorchServe:
    """`handler`: the archive's entry point instead of handler/inf2_handler.py (P2s's per-slot baseline)."""
    return start_torchserve(
        workdir, model_dir, model_config, model_name=model_name, ready_timeout=timeout, handler=handler
    )
