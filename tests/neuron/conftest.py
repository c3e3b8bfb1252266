"""Fixtures for the neuronx backend tests: the fake transformers-neuronx on sys.path, a
private copy of the tiny checkpoint per test (artifacts are written next to it), and
handlers driven through the TorchServe harness; `calls` reads the fake's call log."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.torchserve_harness import make_context

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
)
FAKE_MODULES = ("transformers_neuronx", "neuronxcc")


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


def neuronx_yaml(checkpoint: Path, workers: int = 1, micro_batch_size: int = 2, **handler: Any) -> dict[str, Any]:
    neuronx = {"num_cores": 2, **handler.pop("neuronx", {})}
    return {
        "minWorkers": workers,
        "maxWorkers": workers,
        "batchSize": 4,
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
        "micro_batching": {"micro_batch_size": micro_batch_size},
    }


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
