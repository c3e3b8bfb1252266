"""`backend: auto`: on a host with a Neuron device, neuronx where transformers-neuronx imports
(Neuron SDK <= 2.25), else nxdi where NxD Inference does (SDK 2.26-2.31); else hf. For an encoder
(`handler.task: embed`): neuronx where torch-neuronx imports on a host with a Neuron device, else hf."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from handler.neuron.cores import neuron_devices

# (backend, the package it needs, its name in messages), in order of preference
DEVICE_BACKENDS = (
    ("neuronx", "transformers_neuronx", "transformers-neuronx"),
    ("nxdi", "neuronx_distributed_inference", "NxD Inference"),
)


def choose_backend(dev_dir: Path = Path("/dev")) -> tuple[str, str]:
    """The backend auto picks on this host, and why."""
    devices = neuron_devices(dev_dir)
    installed = [(name, label) for name, package, label in DEVICE_BACKENDS if importlib.util.find_spec(package)]
    if devices and installed:
        name, label = installed[0]
        return name, f"{label} is installed and {len(devices)} Neuron device(s) are present"
    missing = [] if installed else ["transformers-neuronx or NxD Inference"]
    if not devices:
        missing.append("a Neuron device (/dev/neuron*)")
    return "hf", "no " + " and no ".join(missing)


def choose_encoder_backend(dev_dir: Path = Path("/dev")) -> tuple[str, str]:
    """The backend auto picks for an encoder on this host, and why."""
    devices = neuron_devices(dev_dir)
    installed = importlib.util.find_spec("torch_neuronx") is not None
    if devices and installed:
        return "neuronx", f"torch-neuronx is installed and {len(devices)} Neuron device(s) are present"
    missing = ([] if installed else ["torch-neuronx"]) + ([] if devices else ["a Neuron device (/dev/neuron*)"])
    return "hf", "no " + " and no ".join(missing)
