"""requirements-archive.txt: what the PyTorch Neuron DLC lacks, and nothing it has."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
# In the PyTorch Neuron DLC already, built for its Neuron SDK (import name -> why).
DLC_PROVIDED = {
    "torch": "the DLC's torch matches torch-neuronx",
    "torch_neuronx": "Neuron SDK",
    "transformers_neuronx": "Neuron SDK",
    "neuronx_distributed": "Neuron SDK",
    "transformers": "installed with transformers-neuronx",
    "ts": "torchserve",
    "yaml": "a torchserve dependency",
    "numpy": "a torch dependency",
}
NEVER = {"torch", "torch-neuronx", "transformers-neuronx", "torchserve", "torch-model-archiver", "neuronx-cc"}
IMPORT_NAMES = {"pydantic": "pydantic"}  # distribution -> import name where they differ


def requirements() -> list[Requirement]:
    lines = (REPO / "requirements-archive.txt").read_text().splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def third_party_imports() -> set[str]:
    found = set()
    for path in (REPO / "handler").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {name for name in found if name not in sys.stdlib_module_names and name != "handler"}


def test_never_lists_what_the_dlc_builds_for_its_sdk():
    names = {r.name.lower() for r in requirements()}
    assert names and not names & NEVER


def test_every_handler_import_is_in_the_dlc_or_the_archive_requirements():
    listed = {IMPORT_NAMES.get(r.name.lower(), r.name.lower().replace("-", "_")) for r in requirements()}
    missing = third_party_imports() - set(DLC_PROVIDED) - listed
    assert not missing, f"add to requirements-archive.txt (or DLC_PROVIDED if the DLC has it): {sorted(missing)}"


def test_pydantic_2_is_required():
    (pydantic,) = [r for r in requirements() if r.name == "pydantic"]
    assert "2.5" in pydantic.specifier and "1.10" not in pydantic.specifier
