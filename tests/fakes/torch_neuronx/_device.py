"""The fake's NeuronCores: the operator a traced module runs (`fake_neuron::forward`, standing in for
the real `neuron::forward*` of a traced module's TorchScript), its fixed-shape check, and an optional
device-time model.

- Fixed input shapes (api-torch-neuronx-trace.rst, "Fixed Input Shapes" and "Fixed Data Types"): a
  traced module called with another number of inputs, another shape or another dtype than it was
  traced with fails. The real module fails inside the TorchScript interpreter, which surfaces as
  `RuntimeError: The following operation failed in the TorchScript interpreter. ...`; the fake's
  check runs as an operator inside the saved TorchScript graph, so it fails exactly that way, also
  after `torch.jit.save` / `torch.jit.load`. (The SDK's own wording of the message is not documented;
  the fake's names both shapes.) The operator exists only once `torch_neuronx` is imported, as the
  real `neuron::` operators do: `torch.jit.load` of a traced module needs `import torch_neuronx`.
- Cores: the process sees the NeuronCores of NEURON_RT_VISIBLE_CORES ("0-1", "2", "0,1"), else
  FAKE_NEURON_NUM_CORES (default 2: an inf2.xlarge has one Inferentia2 chip with two NeuronCores).
  A call runs on core 0 of the process unless a thread chose another (`on_core`, used by the fake's
  DataParallel and the placement benchmark), and one core runs one call at a time.
- Device time (an invention for benchmarks, off unless FAKE_TORCH_NEURONX_DEVICE_TIME=1): each call
  holds its core for (A + C x batch) x seq / 128 ms, A = 2/7, C = 5/7, so that batch 1 x 128 takes
  1.0 ms and batch 8 x 128 takes 6.0 ms on one core: the Neuron SDK's Inf2 encoder table
  (about-neuron/benchmarks/inf2/inf2-performance.rst, throughput_data_encoder.csv) gives
  bert-base-uncased on inf2.xlarge 1,998 inferences/s at batch 1 (p50 1.0 ms) and 2,674/s at
  batch 8 x 128 (p50 6.0 ms), both cores busy: 2 / 1.0 ms = 2,000/s, 2 x 8 / 6.0 ms = 2,667/s.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Iterator

import torch

from torch_neuronx._calllog import record

DEVICE_TIME_ENV = "FAKE_TORCH_NEURONX_DEVICE_TIME"
NUM_CORES_ENV = "FAKE_NEURON_NUM_CORES"
BASE_MS, PER_ROW_MS, REFERENCE_SEQ = 2.0 / 7.0, 5.0 / 7.0, 128

_core_locks: dict[int, threading.Lock] = {}
_locks_guard = threading.Lock()
_thread = threading.local()


def visible_cores() -> int:
    """How many NeuronCores this process sees."""
    given = os.environ.get("NEURON_RT_VISIBLE_CORES", "").strip()
    if given:
        count = 0
        for part in given.split(","):
            low, _, high = part.partition("-")
            count += int(high or low) - int(low) + 1
        return count
    return int(os.environ.get(NUM_CORES_ENV, "2"))


@contextlib.contextmanager
def on_core(core: int) -> Iterator[None]:
    """Calls made by this thread run on `core` (0-based within the process, like device_ids)."""
    previous = getattr(_thread, "core", 0)
    _thread.core = core
    try:
        yield
    finally:
        _thread.core = previous


def device_ms(batch: int, seq: int) -> float:
    return (BASE_MS + PER_ROW_MS * batch) * seq / REFERENCE_SEQ


def _core_lock(core: int) -> threading.Lock:
    with _locks_guard:
        return _core_locks.setdefault(core, threading.Lock())


def shapes_tensor(inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """[inputs, 1 + max rank] int64: each input's dtype code then its shape, -1-padded (kept as a buffer
    of the traced module, so it survives torch.jit.save/load)."""
    rank = max(t.dim() for t in inputs)
    rows = [[_DTYPES.index(t.dtype), *t.shape, *([-1] * (rank - t.dim()))] for t in inputs]
    return torch.tensor(rows, dtype=torch.int64)


def described(shapes: torch.Tensor) -> list[str]:
    out = []
    for row in shapes.tolist():
        dims = [d for d in row[1:] if d >= 0]
        out.append(f"{_DTYPES[row[0]]}{dims}")
    return out


def _forward(inputs: list[torch.Tensor], expected: torch.Tensor) -> list[torch.Tensor]:
    given = shapes_tensor(tuple(inputs)) if inputs else torch.empty((0, 1), dtype=torch.int64)
    if given.shape != expected.shape or not torch.equal(given, expected):
        record("forward_refused", given=described(given), expected=described(expected))
        raise RuntimeError(
            f"torch_neuronx (fake): this traced module takes inputs {described(expected)} (fixed at trace time) "
            f"but was called with {described(given)}; trace one module per shape (bucketing)"
        )
    core = getattr(_thread, "core", 0)
    if core >= visible_cores():
        raise RuntimeError(f"torch_neuronx (fake): NeuronCore {core} is not visible to this process")
    batch, seq = (inputs[0].shape[0], inputs[0].shape[1]) if inputs[0].dim() >= 2 else (1, 1)
    record("forward", shapes=described(given), core=core)
    if os.environ.get(DEVICE_TIME_ENV) == "1":
        with _core_lock(core):
            time.sleep(device_ms(batch, seq) / 1000)
    return [t.clone() for t in inputs]


_DTYPES = [torch.int64, torch.int32, torch.float32, torch.float16, torch.bfloat16, torch.bool, torch.int8]


def _dispatch(inputs: list[torch.Tensor], expected: torch.Tensor) -> list[torch.Tensor]:
    """The operator's kernel: the `_forward` of the fake as imported now (tests purge and re-import the
    fake, and the operator, defined once per process, must see the current module's cores)."""
    return importlib.import_module("torch_neuronx._device")._forward(inputs, expected)


def _register() -> None:
    """Define the operator once per process (tests re-import the fake; a second definition raises)."""
    try:
        torch.ops.fake_neuron.forward  # noqa: B018
        return
    except (AttributeError, RuntimeError):
        pass
    library = torch.library.Library("fake_neuron", "DEF")
    library.define("forward(Tensor[] inputs, Tensor shapes) -> Tensor[]")
    library.impl("forward", _dispatch, "CompositeExplicitAutograd")
    _LIBRARIES.append(library)  # a Library dropped by the garbage collector unregisters its operators


_LIBRARIES: list[torch.library.Library] = []
_register()
