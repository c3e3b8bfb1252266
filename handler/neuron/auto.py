"""`backend: auto`: neuronx where transformers-neuronx and a Neuron device are both present, else hf."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from handler.neuron.cores import neuron_devices


def choose_backend(dev_dir: Path = Path("/dev")) -> tuple[str, str]:
    """The backend auto picks on this host, and why."""
    has_package = importlib.util.find_spec("transformers_neuronx") is not None
    devices = neuron_devices(dev_dir)
    if has_package and devices:
        return "neuronx", f"transformers-neuronx is installed and {len(devices)} Neuron device(s) are present"
    checks = (("transformers-neuronx", has_package), ("a Neuron device (/dev/neuron*)", bool(devices)))
    return "hf", "no " + " and no ".join(what for what, ok in checks if not ok)
