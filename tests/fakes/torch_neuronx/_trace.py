"""Fake of `torch_neuronx.trace` (api-torch-neuronx-trace.rst at aws-neuron/aws-neuron-sdk, SDK 2.28:
`trace(func, example_inputs, *_, input_output_aliases={}, compiler_workdir=None, compiler_args=None,
partitioner_config=None, inline_weights_to_neff=True, cpu_backend=False)`).

As the real one: runs `func` once on `example_inputs` (a tensor or a tuple of tensors) and returns a
`torch.jit.ScriptModule` that `torch.jit.save` / `torch.jit.load` round-trip; the module accepts only
the traced shapes and dtypes (another raises RuntimeError from the TorchScript interpreter, see
_device.py); `compiler_args` is a str or a list of str; `cpu_backend=True` needs a `--target` in
`compiler_args`; `compiler_workdir` receives the compiler's files. The "compiled graph" is the CPU
graph of `torch.jit.trace`, preceded by the fake operator that checks the shapes and models device
time. Stricter than the real one (which warns and guesses): positional arguments after
`example_inputs` raise TypeError. Every trace is logged (`trace`, with the shapes) in the call log.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from torch_neuronx import _device
from torch_neuronx._calllog import record


class _NeuronGraph(torch.nn.Module):
    """What the fake compiles: the shape check (the device's fixed program), then `func`."""

    def __init__(self, func: Callable[..., Any], shapes: torch.Tensor) -> None:
        super().__init__()
        self.func = func
        self.register_buffer("neuron_input_shapes", shapes)

    def forward(self, *inputs: torch.Tensor) -> Any:
        checked = torch.ops.fake_neuron.forward(list(inputs), self.neuron_input_shapes)
        return self.func(*checked)


def _compiler_args(value: str | Sequence[str] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, (list, tuple)) and all(isinstance(arg, str) for arg in value):
        return list(value)
    raise TypeError(f"compiler_args must be a str or a list of str, got {type(value).__name__}")


def trace(
    func: Callable[..., Any],
    example_inputs: torch.Tensor | tuple[torch.Tensor, ...],
    *_: Any,
    input_output_aliases: dict[Any, Any] | None = None,
    compiler_workdir: str | os.PathLike[str] | None = None,
    compiler_args: str | Sequence[str] | None = None,
    partitioner_config: Any = None,
    inline_weights_to_neff: bool = True,
    cpu_backend: bool = False,
) -> torch.jit.ScriptModule:
    if _:
        raise TypeError(
            "torch_neuronx.trace (fake): pass keyword arguments by name (the real one only warns since 2.15 and "
            "guesses)"
        )
    if not callable(func):
        raise TypeError(f"func must be a torch.nn.Module or a callable, got {type(func).__name__}")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else example_inputs
    if not isinstance(inputs, (tuple, list)) or not inputs or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError("example_inputs must be a tensor or a tuple of tensors")
    if input_output_aliases:
        raise NotImplementedError("torch_neuronx.trace (fake): input_output_aliases is not modelled")
    if partitioner_config is not None:
        raise NotImplementedError("torch_neuronx.trace (fake): partitioner_config is not modelled")
    if not isinstance(inline_weights_to_neff, bool) or not isinstance(cpu_backend, bool):
        raise TypeError("inline_weights_to_neff and cpu_backend must be bool")
    args = _compiler_args(compiler_args)
    if cpu_backend and not any(a == "--target" or a.startswith("--target=") for a in args):
        raise ValueError("cpu_backend=True needs the target in compiler_args, e.g. compiler_args='--target inf2'")
    inputs = tuple(inputs)
    shapes = _device.shapes_tensor(inputs)
    if compiler_workdir is not None:
        workdir = Path(compiler_workdir)
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "command.txt").write_text(shlex.join(["neuronx-cc", "compile", *args]) + "\n")
    record("trace", shapes=_device.described(shapes), compiler_args=args, inline_weights_to_neff=inline_weights_to_neff)
    graph = _NeuronGraph(func, shapes)
    with torch.no_grad():
        traced = torch.jit.trace(graph, inputs, check_trace=False)
    return traced
