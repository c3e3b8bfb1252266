"""Run-time LoRA loads and unloads below the wire (issue 43, item 5): the engine runs them between
steps on its stepping thread, an unload waits for the adapter's last sequence (waiting ones too), and
a replica set loads on every serving replica or on none, and restarts replicas with what is loaded."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from handler.config import ServingConfig
from handler.engine.step_engine import StepEngine
from handler.lora.adapters import AdapterError, AdapterSpec
from handler.replicas.adapter_loads import PendingLoad
from handler.replicas.protocol import AdapterLoaded, LoadAdapter, UnloadAdapter
from handler.request import SlotRequest, SlotRequestError, TokenChoice
from tests.support.lora import make_lora_adapter
from tests.unit.test_engine import ScriptedBackend, make_seq
from tests.unit.test_replicas import Fixture


class AdapterBackend(ScriptedBackend):
    """Serves adapters by name; records on which thread each change ran."""

    def __init__(self, tokenizer, n_slots: int = 2) -> None:
        super().__init__(tokenizer, n_slots)
        self.adapters: set[str] = set()
        self.changes: list[tuple[str, str, str]] = []  # (load | unload, name, thread name)
        self.slot_adapters: dict[int, str | None] = {}

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        return dict(self.shapes)

    def load_adapter(self, spec: AdapterSpec) -> None:
        if spec.name in self.adapters:
            raise AdapterError(f"LoRA adapter {spec.name!r} is already loaded")
        self.adapters.add(spec.name)
        self.changes.append(("load", spec.name, threading.current_thread().name))

    def unload_adapter(self, name: str) -> None:
        in_use = [slot for slot, adapter in self.slot_adapters.items() if adapter == name]
        assert not in_use, f"unloaded {name!r} while slots {in_use} run with it"
        self.adapters.remove(name)
        self.changes.append(("unload", name, threading.current_thread().name))

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        for r in requests:
            if r.adapter_id is not None and r.adapter_id not in self.adapters:
                raise SlotRequestError(r.slot, f"the LoRA adapter {r.adapter_id!r} is not loaded", "model")
        out = super().prefill(requests)
        self.slot_adapters.update({r.slot: r.adapter_id for r in requests})
        return out

    def release(self, slot: int) -> None:
        super().release(slot)
        self.slot_adapters.pop(slot, None)

    def slot_adapter(self, slot: int) -> str | None:
        return self.slot_adapters.get(slot)


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_lora_adapter(tiny_model_dir, tmp_path_factory.mktemp("runtime") / "a", seed=1)


@pytest.fixture
def backend(tiny_tokenizer, tiny_model_dir: Path) -> AdapterBackend:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny_model_dir)
    hidden, kv = config.hidden_size, config.num_key_value_heads * (config.hidden_size // config.num_attention_heads)
    backend = AdapterBackend(tiny_tokenizer)
    backend.shapes = {"q_proj": (hidden, hidden), "v_proj": (hidden, kv)}
    return backend


def test_a_load_runs_on_the_stepping_thread_between_steps(backend, tiny_tokenizer, adapter_dir):
    engine = StepEngine(backend, 10_000)
    engine.start()
    try:
        engine.load_adapter("a", adapter_dir, 16).result(10)
        assert backend.changes == [("load", "a", "step-engine")]
        again = engine.load_adapter("a", adapter_dir, 16)
        with pytest.raises(AdapterError, match="already loaded"):
            again.result(10)
        with pytest.raises(AdapterError, match="rank 8 is above"):
            engine.load_adapter("low", adapter_dir, 4).result(10)
        with pytest.raises(AdapterError, match="is not a folder"):
            engine.load_adapter("gone", adapter_dir / "nope", 16).result(10)
        assert backend.adapters == {"a"}
    finally:
        engine.stop()


def test_an_unload_waits_for_the_last_sequence_naming_it_waiting_ones_included(backend, tiny_tokenizer, adapter_dir):
    engine = StepEngine(backend, 10_000)  # stepped by hand
    engine.load_adapter("a", adapter_dir, 16).result(0)
    running = make_seq(tiny_tokenizer, "one", adapter="a", max_new_tokens=40)
    engine.submit(running)
    engine.step()
    waiting = [make_seq(tiny_tokenizer, f"w{i}", adapter="a", max_new_tokens=3) for i in range(3)]
    for sequence in waiting:  # two slots: one waits behind the others
        engine.submit(sequence)
    engine.unload_adapter("a")
    assert "a" in backend.adapters
    with pytest.raises(AdapterError, match="still being unloaded"):
        engine.load_adapter("a", adapter_dir, 16).result(0)
    steps = 0
    while not all(s.finished for s in [running, *waiting]):
        engine.step()
        steps += 1
        assert steps < 200
    assert all(s.error is None and s.completion_tokens > 0 for s in [running, *waiting])
    engine.step()  # the first step that finds none left forgets it
    assert "a" not in backend.adapters and backend.changes[-1][:2] == ("unload", "a")


def _config(adapters: dict[str, str]) -> ServingConfig:
    return ServingConfig.from_model_yaml(
        {
            "continuousBatching": True,
            "batchSize": 16,
            "jobQueueSize": 64,
            "handler": {"model_checkpoint_dir": "model", "lora": {"adapters": adapters, "runtime_updates": True}},
            "scheduler": {"n_slots": 4, "replicas": 2},
        }
    )


def _replicas(count: int = 2) -> Fixture:
    f = Fixture(count, config=_config({"sql": "adapters/sql"}))
    f.set.launch_all()
    return f


def test_a_replica_set_loads_on_every_serving_replica_and_restarts_them_with_it():
    f = _replicas()
    loading = f.set.load_adapter("chat", Path("/a/chat"), 16)
    sent = [[m for m in f.latest(i).sent if isinstance(m, LoadAdapter)] for i in range(2)]
    assert sent == [[LoadAdapter("chat", "/a/chat", 16)]] * 2
    f.latest(0).say(AdapterLoaded("chat", None))
    assert not loading.done()  # replica 1 has not answered
    f.latest(1).say(AdapterLoaded("chat", None))
    assert loading.result(0) is None
    assert [r.spec.config.handler.lora.adapters for r in f.set._replicas] == [
        {"sql": "adapters/sql", "chat": "/a/chat"}
    ] * 2
    f.set.unload_adapter("sql")
    assert [[m for m in f.latest(i).sent if isinstance(m, UnloadAdapter)] for i in range(2)] == [
        [UnloadAdapter("sql")]
    ] * 2
    assert [r.spec.config.handler.lora.adapters for r in f.set._replicas] == [{"chat": "/a/chat"}] * 2
    f.set.stop()


def test_a_load_one_replica_refuses_is_undone_on_the_others():
    f = _replicas()
    loading = f.set.load_adapter("chat", Path("/a/chat"), 16)
    f.latest(0).say(AdapterLoaded("chat", None))
    f.latest(1).say(AdapterLoaded("chat", "LoRA adapter 'chat': rank 32 is above handler.lora.max_lora_rank (16)"))
    with pytest.raises(AdapterError, match="rank 32"):
        loading.result(0)
    assert [m for m in f.latest(0).sent if isinstance(m, UnloadAdapter)] == [UnloadAdapter("chat")]
    assert [m for m in f.latest(1).sent if isinstance(m, UnloadAdapter)] == []
    assert all("chat" not in r.spec.config.handler.lora.adapters for r in f.set._replicas)
    f.set.stop()


def test_a_replica_going_down_mid_load_counts_as_answered():
    load = PendingLoad("chat", Path("/a"), {0, 1})
    assert not load.answered(0, None)
    assert load.gone(1)  # the last one awaited
    load.settle()
    assert load.future.result(0) is None
    alone = PendingLoad("chat", Path("/a"), {0})
    assert alone.gone(0)
    alone.settle()
    with pytest.raises(AdapterError, match="every replica went down"):
        alone.future.result(0)
