"""Fake of `torch_neuronx.DataParallel(model, device_ids=None, dim=0, set_dynamic_batching=True)`
(api-torch-neuronx-data-parallel.rst and torch-neuronx-dataparallel-app-note.rst, aws-neuron-sdk).

As documented: `model` is a ScriptModule from torch_neuronx.trace, copied onto each NeuronCore of
`device_ids` (ints or 'nc:#', zero-based within the cores this process sees; default all of them);
a call scatters every input along `dim` in chunks of `split_size` (default
max(1, input.shape[dim] // cores)) over the cores, run by `num_workers` threads (default 2 x cores),
and gathers the outputs in order. With dynamic batching (default, dim 0) each chunk is further
sliced into pieces of the compiled batch size; without it a chunk must have the compiled batch size
(input.shape[dim] / len(device_ids) == the traced batch). A piece of another size reaches the traced
module and fails there, as a wrong shape does (whether the real one pads a short last piece is not
documented; the fake does not).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from torch_neuronx import _device


def _core_index(device: int | str) -> int:
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    if isinstance(device, str) and device.startswith("nc:") and device[3:].isdigit():
        return int(device[3:])
    raise ValueError(f"device_ids: {device!r} is neither an int nor 'nc:#'")


class DataParallel(torch.nn.Module):
    def __init__(
        self,
        model: torch.jit.ScriptModule,
        device_ids: list[int | str] | None = None,
        dim: int = 0,
        set_dynamic_batching: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(model, torch.jit.ScriptModule):
            raise TypeError("DataParallel takes a ScriptModule created by torch_neuronx.trace")
        visible = _device.visible_cores()
        cores = list(range(visible)) if device_ids is None else [_core_index(d) for d in device_ids]
        bad = [c for c in cores if not 0 <= c < visible]
        if not cores or bad:
            raise ValueError(f"device_ids {device_ids}: this process sees NeuronCores 0..{visible - 1}")
        self.module = model
        self.device_ids = cores
        self.dim = dim
        self.dynamic_batching = set_dynamic_batching and dim == 0
        self.num_workers = 2 * len(cores)
        self.split_size: int | None = None  # None: max(1, n // cores) per call
        self._compiled_batch = int(model.neuron_input_shapes[0, 1 + dim])
        self._pool: ThreadPoolExecutor | None = None  # the worker threads, started by the first call
        self._lock = threading.Lock()

    def disable_dynamic_batching(self) -> None:
        self.dynamic_batching = False

    def forward(self, *inputs: torch.Tensor) -> Any:
        n = inputs[0].shape[self.dim]
        size = self.split_size or max(1, n // len(self.device_ids))
        chunks = list(zip(*(t.split(size, dim=self.dim) for t in inputs), strict=True))
        if self.dynamic_batching:
            pieces = [
                list(zip(*(t.split(self._compiled_batch, dim=0) for t in chunk), strict=True)) for chunk in chunks
            ]
        else:
            pieces = [[chunk] for chunk in chunks]

        def run(index: int) -> list[Any]:
            core = self.device_ids[index % len(self.device_ids)]
            with _device.on_core(core):
                return [self.module(*piece) for piece in pieces[index]]

        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="neuron-dp")
        if len(pieces) == 1:
            results = run(0)
        else:
            results = [out for outs in self._pool.map(run, range(len(pieces))) for out in outs]
        if isinstance(results[0], torch.Tensor):
            return torch.cat(results, dim=self.dim)
        return tuple(torch.cat(parts, dim=self.dim) for parts in zip(*results, strict=True))
