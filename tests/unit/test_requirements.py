"""The pinned stacks stay pinned and agree: CI's compat venv tests what the Neuron stack runs."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def requirements(name: str) -> dict[str, str]:
    """package -> version specifier ("==2.7.0", "<81") of each requirement line of a requirements file."""
    out: dict[str, str] = {}
    for raw in (REPO / name).read_text().splitlines():
        match = re.fullmatch(r"([A-Za-z0-9_.-]+)\s*([=<>!~][^;]*)", raw.split("#")[0].strip())
        if match:
            out[match.group(1).lower()] = match.group(2).strip()
    return out


def test_every_neuron_requirement_is_pinned_exactly():
    neuron = requirements("requirements-neuron.txt")
    assert neuron and all(spec.startswith("==") for spec in neuron.values()), neuron


def test_the_neuron_stack_is_sdk_2_25():
    neuron = requirements("requirements-neuron.txt")
    assert neuron["transformers-neuronx"] == "==0.13.1216"
    assert neuron["torch-neuronx"] == "==2.7.0.2.9.9357"
    assert neuron["neuronx-cc"] == "==2.20.9961.0"
    assert neuron["torch"].startswith("==2.7.")
    assert neuron["transformers"].startswith("==4.48.")


def test_ci_compat_venv_runs_the_neuron_stacks_torch_and_transformers():
    compat, neuron = requirements("requirements-compat.txt"), requirements("requirements-neuron.txt")
    for package in ("torch", "transformers", "tokenizers"):
        assert compat[package] == neuron[package], package
    assert compat["torchserve"] == "==0.11.0"  # what every SageMaker Neuron DLC runs


def test_the_nxdi_stack_is_sdk_2_28_and_ci_tests_its_python_stack():
    nxdi, py312 = requirements("requirements-nxdi.txt"), requirements("requirements-py312.txt")
    assert nxdi and all(spec.startswith("==") for spec in nxdi.values()), nxdi
    assert nxdi["neuronx-distributed-inference"] == "==0.8.16251"
    assert nxdi["torch-neuronx"] == "==2.9.0.2.12.22436" and nxdi["neuronx-cc"] == "==2.23.6484.0"
    for package in ("torch", "transformers", "tokenizers"):
        assert py312[package] == nxdi[package], package
    assert nxdi["transformers"].startswith("==4.57.")
    assert py312["torchserve"] == "==0.11.0"  # what the SDK 2.26-2.31 DLCs run


def test_the_eval_venv_tokenizes_as_the_server_does():
    """lm-eval sends token ids from its own tokenizer: the same transformers and tokenizers as the
    serving venv, so its ids are the ones the server would make."""
    evaluation, serving = requirements("requirements-eval.txt"), requirements("requirements.txt")
    for package in ("transformers", "tokenizers"):
        assert evaluation[package] == serving[package], package
