"""On a real inf2 host only: the real transformers-neuronx compiles, saves, reloads and serves
the step contract with continuous batching.

Run there with `make test-neuron` (see docs/inferentia2.md). Skipped elsewhere,
and whenever the transformers_neuronx found is the test fake.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from tests.support.neuron import FAKES, Driver, greedy, neuronx_yaml, run_alone

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
def test_real_device_compiles_once_then_loads_and_serves_continuous_batching(real_checkpoint, start_backend):
    """On the device: compile, then load; a request that joins mid-decode (a 1-token prompt too) gets
    the tokens it gets alone, and the others' tokens do not change (the decode-kernel trap)."""
    model_yaml = neuronx_yaml(
        real_checkpoint, n_slots=3, tp_degree=1, neuronx={"num_cores": None, "context_length_estimate": [16, 256]}
    )
    backend = start_backend(model_yaml)
    assert backend.path_taken == "compile"
    backend.close()
    backend = start_backend(model_yaml)
    assert backend.path_taken == "load"

    a, b = backend.encode("Today the weather is"), backend.encode("Once upon a time there was")
    one = backend.encode("Today")[:1]
    alone = {"a": run_alone(backend, a, 12), "b": run_alone(backend, b, 12), "one": run_alone(backend, one, 6)}
    driver = Driver(backend)
    driver.join(greedy(0, a))
    for _ in range(3):
        driver.step()
    driver.join(greedy(1, b))
    driver.step()
    driver.join(greedy(2, one))
    for _ in range(10):
        driver.step()
    assert driver.leave(2)[:6] == alone["one"]
    assert driver.leave(1)[:12] == alone["b"]
    assert driver.leave(0)[:12] == alone["a"]
