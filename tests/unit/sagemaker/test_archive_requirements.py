"""requirements-archive.txt: what the PyTorch Neuron DLC lacks, and nothing it has
(`make sagemaker-archive` bundles it into the archive's deps/)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[3]
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
    "tokenizers": "a transformers dependency",
    "safetensors": "a transformers dependency",
}
# Imported only for an optional feature and never bundled (import name -> why).
NOT_BUNDLED = {
    "peft": "LoRA adapters on the hf backend only, imported when one loads (handler/backends/hf_lora.py): here pip "
    "would bundle torch and transformers with it; an archive whose config serves adapters on hf gets it (and "
    "accelerate) with --no-deps instead (scripts/sagemaker/archive.py, LORA_PACKAGES)",
}
NEVER = {"torch", "torch-neuronx", "transformers-neuronx", "torchserve", "torch-model-archiver", "neuronx-cc"}
# distribution -> the import names it brings (pydantic pins pydantic-core exactly; pip bundles both)
IMPORT_NAMES = {"pydantic": {"pydantic", "pydantic_core"}}
# Not run by TorchServe from the archive: the ASGI frontend runs in the serving venv (requirements.txt
# pins uvicorn and starlette), docs/frontends.md.
NOT_IN_THE_ARCHIVES_RUN = ("frontend",)


def requirements() -> list[Requirement]:
    lines = (REPO / "requirements-archive.txt").read_text().splitlines()
    return [Requirement(line.split("#")[0].strip()) for line in lines if line.split("#")[0].strip()]


def third_party_imports() -> set[str]:
    found = set()
    for path in (REPO / "handler").rglob("*.py"):
        if path.relative_to(REPO / "handler").parts[0] in NOT_IN_THE_ARCHIVES_RUN:
            continue
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
    names = [r.name.lower() for r in requirements()]
    listed = set().union(*(IMPORT_NAMES.get(name, {name.replace("-", "_")}) for name in names))
    missing = third_party_imports() - set(DLC_PROVIDED) - set(NOT_BUNDLED) - listed
    assert not missing, f"add to requirements-archive.txt (or DLC_PROVIDED if the DLC has it): {sorted(missing)}"


def test_pydantic_2_is_pinned_as_the_tests_run_it():
    """The bundle (deps/) is built from these lines: exact pins, the versions requirements.txt tests."""
    (pydantic,) = [r for r in requirements() if r.name == "pydantic"]
    assert str(pydantic.specifier).startswith("==2.")
    tested = [line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    assert f"pydantic{pydantic.specifier}" in tested


def test_every_line_is_an_exact_pin():
    assert all(str(r.specifier).startswith("==") and "*" not in str(r.specifier) for r in requirements())
