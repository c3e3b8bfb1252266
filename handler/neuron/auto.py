"""`backend: auto`: neuronx where transformers-neuronx and a Neuron device are both present, else hf."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

from handler.config import ServingConfig
from handler.neuron.cores import neuron_devices, workers_of

logger = logging.getLogger(__name__)


def choose_backend(dev_dir: Path = Path("/dev")) -> tuple[str, str]:
    """The backend auto picks on this host, and why."""
    has_package = importlib.util.find_spec("transformers_neuronx") is not None
    devices = neuron_devices(dev_dir)
    if has_package and devices:
        return "neuronx", f"transformers-neuronx is installed and {len(devices)} Neuron device(s) are present"
    checks = (("transformers-neuronx", has_package), ("a Neuron device (/dev/neuron*)", bool(devices)))
    return "hf", "no " + " and no ".join(what for what, ok in checks if not ok)


def resolve_auto(config: ServingConfig, dev_dir: Path = Path("/dev")) -> ServingConfig:
    """The same config with `backend: auto` replaced by the backend chosen here (logged)."""
    if config.handler.backend != "auto":
        return config
    chosen, why = choose_backend(dev_dir)
    logger.info("backend auto: using %s (%s)", chosen, why)
    handler = config.handler.model_copy(update={"backend": chosen})
    return config.model_copy(update={"handler": handler})


def worker_of(context: Any) -> tuple[int | None, int]:
    """(TorchServe's gpu_id for this worker or None, the model's worker count) from a TorchServe context."""
    if context is None:
        return None, 1
    gpu_id = (getattr(context, "system_properties", None) or {}).get("gpu_id")
    return (int(gpu_id) if gpu_id is not None else None), workers_of(getattr(context, "model_yaml_config", None))
