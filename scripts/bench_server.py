"""The benchmark's own torchserve: scripts/local_torchserve.py (private temp dir, free ports,
quiet log config) with Prometheus metrics mode on, so the handler's token metrics can be
scraped after the loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from local_torchserve import TorchServe, start_torchserve

METRICS_PROPERTIES = {"metrics_mode": "prometheus", "model_metrics_auto_detect": "true"}


def start(
    workdir: Path, model_dir: Path, model_config: dict[str, Any], model_name: str = "llama", timeout: float = 180
) -> TorchServe:
    properties = {**METRICS_PROPERTIES, "default_response_timeout": "300"}
    return start_torchserve(
        workdir, model_dir, model_config, model_name=model_name, extra_properties=properties, ready_timeout=timeout
    )
