"""`scheduler.replicas` on neuronx with the fake transformers-neuronx: each replica is a process
of its own, pinned to its own tp_degree NeuronCores (the fake logs what each process saw);
the first compiles, the other loads what it saved, a restart loads both; a layout that does
not fit is refused with the numbers before any process starts."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from handler.config import ServingConfig
from handler.engine.sequence import Sequence
from handler.errors import ConfigError
from handler.replicas.model import ReplicatedModel, start_replicas
from handler.request import GenerationRequest
from tests.neuron.conftest import calls, neuronx_yaml


def replicated(checkpoint: Path, replicas: int, tp_degree: int = 2, num_cores: int = 4) -> ServingConfig:
    yaml = neuronx_yaml(checkpoint, n_slots=2, tp_degree=tp_degree, neuronx={"num_cores": num_cores})
    yaml["scheduler"]["replicas"] = replicas
    yaml["batchSize"] = 2 * 2 * replicas
    return ServingConfig.from_model_yaml(yaml)


def generate(model: ReplicatedModel, prompts: list[str]) -> dict[str, tuple[int | None, str]]:
    """Each prompt through the replica set: the replica that served it and its finish reason."""
    replicas = model.replicas
    replicas.start()
    sequences = {}
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(prompt, 6, ignore_eos=True)
        sequence = Sequence(request, model.encode(prompt), model.tokenizer, model.eos_token_ids, f"r{i}")
        replicas.submit(sequence)
        sequences[sequence.request_id] = (replicas.replica_of(sequence.request_id), sequence)
    deadline = time.monotonic() + 60
    ended: set[str] = set()
    while len(ended) < len(sequences) and time.monotonic() < deadline:
        replicas.wait(sequences, replicas.steps, 1.0)
        ended |= {rid for rid, update in replicas.take(sequences).items() if update.ended}
    return {rid: (replica, str(s.finish_reason)) for rid, (replica, s) in sequences.items()}


@pytest.mark.timeout(180)
def test_two_replicas_on_disjoint_cores_compile_once(fake_neuronx: Path, checkpoint: Path):
    model = start_replicas(replicated(checkpoint, 2), str(checkpoint))
    try:
        served = generate(model, ["Hello there", "Another prompt"])
    finally:
        model.close()
    assert sorted(served.values()) == [(0, "length"), (1, "length")]
    first = calls(fake_neuronx, "to_neuron")
    assert [(c["mode"], c["visible_cores"]) for c in first] == [("compile", "0-1"), ("load", "2-3")]
    assert len({c["pid"] for c in first}) == 2 and os.getpid() not in {c["pid"] for c in first}
    assert len(calls(fake_neuronx, "save")) == 1

    again = start_replicas(replicated(checkpoint, 2), str(checkpoint))  # a restart: the artifacts are there
    again.close()
    second = calls(fake_neuronx, "to_neuron")[len(first) :]
    assert sorted((c["mode"], c["visible_cores"]) for c in second) == [("load", "0-1"), ("load", "2-3")]


@pytest.mark.timeout(60)
def test_too_many_replicas_are_refused_before_any_starts(fake_neuronx: Path, checkpoint: Path):
    with pytest.raises(ConfigError, match=r"3 replicas x tp_degree 2 need 6 NeuronCores but 4 are available"):
        start_replicas(replicated(checkpoint, 3), str(checkpoint))
    assert not fake_neuronx.exists(), "a replica process started (the fake SDK was imported)"
