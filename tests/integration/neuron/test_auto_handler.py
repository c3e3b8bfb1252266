"""`backend: auto` through the handler: neuronx with the SDK and a device, hf without a device."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.neuron import neuronx_yaml

pytestmark = pytest.mark.usefixtures("fake_neuronx")


@pytest.mark.parametrize(("devices", "expected"), [(["neuron0"], "neuronx"), ([], "hf")])
def test_auto_backend(checkpoint, start_handler, monkeypatch, tmp_path, devices, expected):
    import handler.neuron.auto as auto

    monkeypatch.setattr(auto, "neuron_devices", lambda dev_dir=None: [Path("/dev") / d for d in devices])
    model_yaml = neuronx_yaml(checkpoint)
    model_yaml["handler"]["backend"] = "auto"
    handler, _ = start_handler(model_yaml)
    assert handler.serving.service.backend.name == expected
