"""The fake torch_neuronx is as strict as the SDK's documentation says the real one is
(tests/fakes/torch_neuronx/): a traced module is a ScriptModule that survives torch.jit.save/load and
takes only its traced shapes; trace checks its arguments; DataParallel splits dim 0 across the cores."""

from __future__ import annotations

import pytest
import torch

from tests.support.neuron import calls

pytestmark = pytest.mark.usefixtures("fake_neuronx")


def scaled(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return 2 * x + y


def example(batch: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(batch * 3, dtype=torch.float32).reshape(batch, 3), torch.ones((batch, 3))


def test_a_traced_module_round_trips_and_refuses_other_shapes(tmp_path):
    import torch_neuronx

    traced = torch_neuronx.trace(scaled, example())
    assert isinstance(traced, torch.jit.ScriptModule)
    torch.jit.save(traced, str(tmp_path / "m.pt"))
    loaded = torch.jit.load(str(tmp_path / "m.pt"))
    assert torch.equal(loaded(*example()), scaled(*example()))
    x, y = example()
    for bad in ((*example(3),), (x.double(), y), (x[:, :2], y[:, :2])):
        with pytest.raises(RuntimeError, match="TorchScript interpreter"):
            loaded(*bad)
    with pytest.raises(RuntimeError):
        loaded(x)  # another number of inputs


def test_trace_checks_its_arguments_as_documented(tmp_path, fake_neuronx):
    import torch_neuronx

    with pytest.raises(TypeError, match="compiler_args"):
        torch_neuronx.trace(scaled, example(), compiler_args=7)
    with pytest.raises(ValueError, match="--target"):
        torch_neuronx.trace(scaled, example(), cpu_backend=True)
    with pytest.raises(TypeError, match="keyword"):
        torch_neuronx.trace(scaled, example(), str(tmp_path))
    with pytest.raises(TypeError, match="example_inputs"):
        torch_neuronx.trace(scaled, [1, 2])
    traced = torch_neuronx.trace(
        scaled, example(), compiler_args="--target inf2", cpu_backend=True, compiler_workdir=str(tmp_path / "work")
    )
    assert (tmp_path / "work" / "command.txt").read_text().startswith("neuronx-cc compile --target inf2")
    assert calls(fake_neuronx, "trace")[-1]["shapes"] == ["torch.float32[2, 3]", "torch.float32[2, 3]"]
    assert traced(*example()).shape == (2, 3)


def test_data_parallel_splits_dim_0_across_the_cores_in_order(fake_neuronx, monkeypatch):
    import torch_neuronx

    monkeypatch.setenv("FAKE_NEURON_NUM_CORES", "2")
    parallel = torch_neuronx.DataParallel(torch_neuronx.trace(scaled, example(2)))
    traced_runs = len(calls(fake_neuronx, "forward"))  # trace runs the function once
    x, y = example(8)
    assert torch.equal(parallel(x, y), scaled(x, y))  # 8 rows: 4 per core, each in 2 pieces of the traced 2
    forwards = calls(fake_neuronx, "forward")[traced_runs:]
    assert len(forwards) == 4 and {c["core"] for c in forwards} == {0, 1}

    parallel.disable_dynamic_batching()
    assert torch.equal(parallel(*example(4)), scaled(*example(4)))  # 4 / 2 cores == the traced batch
    with pytest.raises(RuntimeError, match="TorchScript interpreter"):
        parallel(*example(8))  # 8 / 2 cores != 2, and no slicing without dynamic batching


def test_data_parallel_takes_only_visible_cores_and_traced_modules(monkeypatch):
    import torch_neuronx

    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-5")  # two cores, seen as nc:0 and nc:1
    traced = torch_neuronx.trace(scaled, example())
    assert torch_neuronx.DataParallel(traced, device_ids=["nc:1", 0]).device_ids == [1, 0]
    with pytest.raises(ValueError, match=r"sees NeuronCores 0\.\.1"):
        torch_neuronx.DataParallel(traced, device_ids=[4])
    with pytest.raises(TypeError, match="ScriptModule"):
        torch_neuronx.DataParallel(torch.nn.Linear(3, 3))
