"""On a real inf2 host only: the real transformers-neuronx compiles, saves, reloads and generates.

Run there with `make test-neuron` (see docs/readme-inferentia2.md). Skipped elsewhere,
and whenever the transformers_neuronx found is the test fake.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.neuron.conftest import FAKES, neuronx_yaml
from tests.torchserve_harness import run_batch

pytestmark = pytest.mark.neuron


def real_neuron_reason() -> str | None:
    spec = importlib.util.find_spec("transformers_neuronx")
    if spec is None:
        return "transformers-neuronx is not installed (pip install -r requirements-neuron.txt on an inf2 host)"
    if spec.origin and Path(spec.origin).is_relative_to(FAKES):
        return "only the test fake of transformers-neuronx is importable"
    if not list(Path("/dev").glob("neuron[0-9]*")):
        return "no Neuron device (/dev/neuron*)"
    return None


@pytest.fixture
def real_checkpoint(tiny_model_dir: Path, tmp_path: Path) -> Path:
    reason = real_neuron_reason()
    if reason:
        pytest.skip(reason)
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    return target


@pytest.mark.timeout(1800)
def test_real_device_compiles_once_then_loads_and_generates(real_checkpoint, start_handler):
    model_yaml = neuronx_yaml(real_checkpoint, tp_degree=1, neuronx={"num_cores": None})
    handler, context = start_handler(model_yaml)
    assert handler.service.backend.path_taken == "compile"
    [reply] = run_batch(handler, context, [{"prompt": "Today the weather is", "max_new_tokens": 8}])
    assert reply.status == 200 and reply.lines[-1]["usage"]["completion_tokens"] >= 1
    handler.shutdown()
    handler, context = start_handler(model_yaml)
    assert handler.service.backend.path_taken == "load"
    [again] = run_batch(handler, context, [{"prompt": "Today the weather is", "max_new_tokens": 8, "stream": False}])
    assert again.status == 200
