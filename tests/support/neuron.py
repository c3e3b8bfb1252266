"""Fixtures for the neuronx backend tests: the fake transformers-neuronx on sys.path, a
private copy of the tiny checkpoint per test (artifacts are written next to it), the
backend started directly (`start_backend`) or through the handler (`start_handler`, for the
tests that need the engine), a minimal step driver; `calls` reads the fake's call log."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.support.torchserve_harness import make_context

FAKES = Path(__file__).resolve().parent.parent / "fakes"
NEURON_ENV = (
    "NEURON_CC_FLAGS",
    "NEURON_COMPILE_CACHE_URL",
    "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES",
    "NEURONX_DUMP_TO",
    "NEURONX_CACHE",
    "FAKE_NEURONXCC_VERSION",
    "INF2_OPERATOR_NEURON_CC_FLAGS",
    "INF2_OPERATOR_VISIBLE_CORES",
)
FAKE_MODULES = (
    "transformers_neuronx",
    "neuronxcc",
    "neuronx_distributed_inference",
    "neuronx_distributed",
    "torch_neuronx",
)


def purge_fake_modules() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in FAKE_MODULES:
            del sys.modules[name]


@pytest.fixture
def fake_neuronx(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """The fake SDK importable, a clean Neuron environment (restored afterwards); yields the call log path."""
    for name in NEURON_ENV:
        monkeypatch.setenv(name, "")  # remembers the original value, so teardown restores it
        monkeypatch.delenv(name)
    call_log = tmp_path / "neuronx-calls.jsonl"
    monkeypatch.setenv("FAKE_NEURONX_CALL_LOG", str(call_log))
    monkeypatch.setenv("INF2_NEURON_CORE_LOCK_DIR", str(tmp_path / "core-locks"))
    monkeypatch.syspath_prepend(str(FAKES))
    purge_fake_modules()
    yield call_log
    purge_fake_modules()


@pytest.fixture
def nxdi_compiles_in_process(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The nxdi compile runs in the test's process instead of a child: a child imports torch and
    transformers again (about 3.5 s on 2 cores, most of the fast tier's time). The call is the
    child's own (`nxdi.compile_model`) with the same private BASE_COMPILE_WORK_DIR, removed
    afterwards. A test marked `compile_in_child` keeps the child."""
    if request.node.get_closest_marker("compile_in_child"):
        return
    from handler.backends import nxdi

    def compile_here(recipe: Any, out_dir: str, artifacts_dir: Path, timeout_s: float | None = None) -> None:
        scratch = nxdi.compile_work_dir(artifacts_dir)
        with monkeypatch.context() as env:
            env.setenv("BASE_COMPILE_WORK_DIR", f"{scratch}/")
            try:
                nxdi.compile_model(recipe, out_dir)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)

    monkeypatch.setattr(nxdi, "compile_in_child", compile_here)


@pytest.fixture
def one_torch_thread() -> Iterator[None]:
    """The fakes' tiny forwards on a busy 2-core host run faster on one thread."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def checkpoint(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny model: compiled artifacts land in <checkpoint>/neuron_cache."""
    target = tmp_path / "model"
    shutil.copytree(tiny_model_dir, target)
    return target


def calls(call_log: Path, name: str) -> list[dict[str, Any]]:
    """The fake's recorded `name` calls, in order. The fake writes an `import` line as soon as
    it is imported, so a missing log means it never ran (or never saw FAKE_NEURONX_CALL_LOG):
    that fails here, so `assert not calls(...)` cannot pass on a log nobody wrote."""
    assert call_log.is_file(), (
        f"the fake transformers-neuronx never wrote its call log {call_log}: it was not imported with "
        "FAKE_NEURONX_CALL_LOG set, so an empty answer would prove nothing"
    )
    lines = call_log.read_text(encoding="utf-8").split("\n")[:-1]  # a line still being written has no newline
    return [call for call in map(json.loads, filter(None, lines)) if call["call"] == name]


def neuronx_yaml(checkpoint: Path, workers: int = 1, n_slots: int = 2, **handler: Any) -> dict[str, Any]:
    """A model-config.yaml for continuous batching on neuronx: `n_slots` is the compiled batch size."""
    neuronx = {"num_cores": 2, **handler.pop("neuronx", {})}
    return {
        "minWorkers": workers,
        "maxWorkers": workers,
        "continuousBatching": True,
        "batchSize": 2 * n_slots,
        "scheduler": {"mode": "continuous", "n_slots": n_slots},
        "handler": {
            "model_checkpoint_dir": str(checkpoint),
            "backend": "neuronx",
            "n_positions": 256,
            "default_max_new_tokens": 8,
            "max_new_tokens": 64,
            "tp_degree": 1,
            **handler,
            "neuronx": neuronx,
        },
    }


def nxdi_yaml(checkpoint: Path, n_slots: int = 2, **handler: Any) -> dict[str, Any]:
    """The neuronx model-config.yaml with backend nxdi: `n_slots` is NxDI's compiled batch size."""
    nxdi = {"num_cores": 2, **handler.pop("nxdi", {})}
    yaml = neuronx_yaml(checkpoint, n_slots=n_slots, **handler)
    yaml["handler"].pop("neuronx")
    yaml["handler"].update(backend="nxdi", nxdi=nxdi)
    return yaml


@pytest.fixture
def start_backend() -> Iterator[Callable[..., Any]]:
    """start_backend(model_yaml, gpu_id=None, warmup=True) -> NeuronxBackend or NxdiBackend (by the
    config's backend), built as the loader builds
    it (the worker count from minWorkers/maxWorkers) and warmed up; every backend is closed afterwards."""
    from handler.backends.neuronx import NeuronxBackend
    from handler.backends.nxdi import NxdiBackend
    from handler.config import ServingConfig
    from handler.serving.service import workers_of

    started: list[Any] = []

    def start(model_yaml: dict[str, Any], gpu_id: int | None = None, warmup: bool = True) -> Any:
        config = ServingConfig.from_model_yaml(model_yaml)
        checkpoint = Path(model_yaml["handler"]["model_checkpoint_dir"])
        backend_cls = NxdiBackend if config.handler.backend == "nxdi" else NeuronxBackend
        backend = backend_cls(config, checkpoint, gpu_id, workers_of(model_yaml))
        started.append(backend)
        if warmup:
            backend.warmup()  # as the service does after loading
        return backend

    yield start
    for backend in started:
        backend.close()


def greedy(slot: int, prompt: Sequence[int], **fields: Any) -> Any:
    from handler.request import SlotRequest

    return SlotRequest(slot, tuple(prompt), **fields)


class Driver:
    """The engine's part, minimal: prefill into free slots, decode every live slot, release at a
    length. `tokens[slot]` holds what each slot's current sequence produced."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.tokens: dict[int, list[int]] = {}
        self.finished: list[list[int]] = []

    def join(self, *requests: Any) -> None:
        for request, choice in zip(requests, self.backend.prefill(list(requests)), strict=True):
            self.tokens[request.slot] = [choice.token_id]

    def step(self) -> None:
        slots = sorted(self.tokens)
        for slot, choice in zip(slots, self.backend.decode(slots), strict=True):
            self.tokens[slot].append(choice.token_id)

    def leave(self, slot: int) -> list[int]:
        self.backend.release(slot)
        return self.tokens.pop(slot)


def run_alone(backend: Any, prompt: Sequence[int], new_tokens: int, slot: int = 0) -> list[int]:
    """A greedy sequence with the backend to itself."""
    driver = Driver(backend)
    driver.join(greedy(slot, prompt))
    for _ in range(new_tokens - 1):
        driver.step()
    return driver.leave(slot)


@pytest.fixture
def start_handler() -> Iterator[Callable[..., Any]]:
    """start_handler(model_yaml, gpu_id=None) -> (handler, context); every handler is shut down afterwards."""
    from handler.inf2_handler import Inf2StreamingHandler

    started: list[Any] = []

    def start(model_yaml: dict[str, Any], gpu_id: int | None = None) -> tuple[Any, Any]:
        handler = Inf2StreamingHandler()
        context = make_context(model_yaml, str(Path(model_yaml["handler"]["model_checkpoint_dir"]).parent))
        context.system_properties["gpu_id"] = gpu_id
        started.append(handler)
        handler.initialize(context)
        return handler, context

    yield start
    for handler in started:
        handler.shutdown()


def hf_greedy(checkpoint: Path, prompt: Sequence[int], new_tokens: int) -> list[int]:
    """The reference: the Hugging Face model itself, greedy, one token at a time over the whole sequence."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    version = tuple(int(part) for part in transformers.__version__.split(".")[:2])
    dtype = {"dtype" if version >= (4, 56) else "torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, **dtype).eval()
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(new_tokens):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt) :]
