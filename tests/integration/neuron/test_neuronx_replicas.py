"""`scheduler.replicas` on neuronx with the fake transformers-neuronx: each replica is a process
of its own, pinned to its own tp_degree NeuronCores (the fake logs what each process saw);
the first compiles, the other loads what it saved, a restart loads both; a layout that does
not fit is refused with the numbers before any process starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.replicas.model import start_replicas
from tests.support.neuron import neuronx_yaml


def replicated(checkpoint: Path, replicas: int, tp_degree: int = 2, num_cores: int = 4) -> ServingConfig:
    yaml = neuronx_yaml(checkpoint, n_slots=2, tp_degree=tp_degree, neuronx={"num_cores": num_cores})
    yaml["scheduler"]["replicas"] = replicas
    yaml["batchSize"] = 2 * 2 * replicas
    return ServingConfig.from_model_yaml(yaml)


@pytest.mark.timeout(60)
def test_too_many_replicas_are_refused_before_any_starts(fake_neuronx: Path, checkpoint: Path):
    with pytest.raises(ConfigError, match=r"3 replicas x tp_degree 2 need 6 NeuronCores but 4 are available"):
        start_replicas(replicated(checkpoint, 3), str(checkpoint))
    assert not fake_neuronx.exists(), "a replica process started (the fake SDK was imported)"
