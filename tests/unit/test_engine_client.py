"""The engine client both frontends use (handler/core/engine_client.py), against the scripted
step-level backend of test_engine.py and a real StepEngine: a request goes to the engine when it
arrives and a held step is released at once; a request whose constraint compiles is held until
it compiled (and one refused gets its 400 as news); the step watchdog fails what is in flight
when a step hangs, and the engine serves the next request once the step returns; a replica that
gives up fails the model once."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from functools import partial
from types import SimpleNamespace

from handler.api.native import NativeApi
from handler.core.engine_client import EngineClient
from handler.core.preparation import GenerationCore, Work
from handler.engine.step_engine import StepEngine
from handler.errors import EngineError, InvalidRequest, Overloaded, ServingError
from handler.grammar.compiler import PendingConstraint, _Start
from handler.replicas.replica_set import Health
from tests.unit.test_engine import ScriptedBackend, make_seq, reply

CORE = SimpleNamespace(settle=partial(GenerationCore.settle, None))  # settle reads only the work


def work_for(tokenizer, prompt: str, request_id: str, n: int = 1, **kwargs) -> Work:
    work = Work(request_id, NativeApi())
    work.sequences = [
        make_seq(tokenizer, prompt, request_id if i == 0 else f"{request_id}/{i}", **kwargs) for i in range(n)
    ]
    return work


def client_over(backend: ScriptedBackend, step_timeout_s: float = 600.0) -> EngineClient:
    return EngineClient(CORE, StepEngine(backend, 10_000), step_timeout_s)  # type: ignore[arg-type]


def drain(client: EngineClient, request_ids: list[str], limit_s: float = 30.0) -> dict[str, list]:
    """Every piece of news of these requests until each had its last (the engine steps on its thread)."""
    got: dict[str, list] = {r: [] for r in request_ids}
    deadline = time.monotonic() + limit_s
    while any(client.knows(r) for r in request_ids):
        assert time.monotonic() < deadline, "the requests never ended"
        client.wait(request_ids, client.steps, 0.2)
        for request_id, news in client.take(request_ids).items():
            got[request_id].append(news)
    return got


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def submit(self, sequence) -> None:
        self.calls.append(("submit", sequence.request_id))

    def admissions_done(self) -> None:
        self.calls.append(("admissions_done",))

    def abort(self, request_id: str) -> None:
        self.calls.append(("abort", request_id))

    def step_running_for(self) -> float:
        return 0.0

    def take(self, request_ids) -> dict:
        return {}


def test_a_submit_hands_every_sequence_over_then_releases_a_held_step(tiny_tokenizer):
    engine = RecordingEngine()
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    client.submit(work_for(tiny_tokenizer, "two outputs", "r", n=2))
    assert engine.calls == [("submit", "r"), ("submit", "r/1"), ("admissions_done",)]
    assert client.in_flight == 2
    assert client.release("r") is True  # both still generating: a cancellation
    assert sorted(engine.calls[3:]) == [("abort", "r"), ("abort", "r/1")]
    assert client.in_flight == 0 and client.release("r") is False


def pending(timeout_s: float = 30.0) -> tuple[PendingConstraint, Future]:
    future: Future = Future()
    return PendingConstraint(future, timeout_s, _Start(at=time.monotonic())), future


def test_a_request_whose_constraint_compiles_is_held_until_it_compiled(tiny_tokenizer):
    engine = RecordingEngine()
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    work = work_for(tiny_tokenizer, "constrained", "c")
    work.compiling, future = pending()
    client.submit(work)
    assert engine.calls == [] and client.in_flight == 1
    assert client.take(["c"]) == {}
    future.set_result(None)  # compiled: handed over from the compile thread's callback, no poll
    assert engine.calls == [("submit", "c"), ("admissions_done",)]
    assert work.compiling is None and work.error is None


def test_a_refused_constraint_is_news_with_its_400_and_never_reaches_the_engine(tiny_tokenizer):
    engine = RecordingEngine()
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    work = work_for(tiny_tokenizer, "constrained", "c")
    work.compiling, future = pending()
    client.submit(work)
    future.set_result("the schema has a cycle")
    news = client.take(["c"])["c"]
    assert isinstance(news.failure, InvalidRequest) and "the schema has a cycle" in news.failure.message
    assert news.updates == [] and engine.calls == [] and not client.knows("c")


def test_a_constraint_past_its_budget_is_refused_at_the_next_take(tiny_tokenizer):
    engine = RecordingEngine()
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    work = work_for(tiny_tokenizer, "constrained", "c")
    work.compiling, _ = pending(timeout_s=0.0)
    client.submit(work)
    news = client.take(["c"])["c"]
    assert isinstance(news.failure, InvalidRequest) and "time budget" in news.failure.message
    assert engine.calls == []


def test_a_drain_deadline_fails_a_held_request_too(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer)
    client = client_over(backend)
    work = work_for(tiny_tokenizer, "constrained", "c")
    work.compiling, future = pending()
    client.submit(work)
    client.fail_all(EngineError("the server is draining"))
    future.set_result(None)  # compiled after all: not handed over
    news = client.take(["c"])["c"]
    assert news.failure is not None and news.failure.message == "the server is draining"
    assert client.engine.waiting == 0


class HangingBackend(ScriptedBackend):
    """A decode call holding a prompt with "hang" blocks until `release` is set (a hung device call)."""

    def __init__(self, tokenizer) -> None:
        super().__init__(tokenizer)
        self.release = threading.Event()
        self.hanging = threading.Event()

    def decode(self, slots):
        if any("hang" in self.live[s].prompt for s in slots if s in self.live) and not self.release.is_set():
            self.hanging.set()
            self.release.wait(30)
        return super().decode(slots)


def test_a_hung_step_fails_what_is_in_flight_and_the_next_request_is_served(tiny_tokenizer):
    backend = HangingBackend(tiny_tokenizer)
    client = client_over(backend, step_timeout_s=0.3)
    client.start()
    try:
        client.submit(work_for(tiny_tokenizer, "please hang", "hung", max_new_tokens=8))
        client.submit(work_for(tiny_tokenizer, "a bystander", "mate", max_new_tokens=200, ignore_eos=True))
        assert backend.hanging.wait(10)
        got = drain(client, ["hung", "mate"], limit_s=20)  # the step hangs until `release`: only the watchdog ends them
        for request_id in ("hung", "mate"):
            failure = got[request_id][-1].failure
            assert isinstance(failure, ServingError) and "did not finish a step within" in failure.message
            assert failure.status == 500
        backend.release.set()
        client.submit(work_for(tiny_tokenizer, "after the hang", "next", max_new_tokens=64))
        got = drain(client, ["next"])
        text = "".join(u.text for news in got["next"] for u in news.updates)
        assert got["next"][-1].failure is None and text == reply("after the hang")
        assert client.engine.occupied == 0  # the failed ones left their slots when the step returned
    finally:
        backend.release.set()
        client.stop()


class GivingUpReplicas(RecordingEngine):
    """A ReplicaSet as the client sees it when one replica gave up starting."""

    def __init__(self) -> None:
        super().__init__()
        self.on_health = None
        self.failed_with: list[ServingError] = []

    def health(self) -> Health:
        return Health(3, 2, (0, None, 0), "2 of 3 replicas serving (...)", "replica 1 failed 3 starts")

    def fail_all(self, error: ServingError) -> None:
        self.failed_with.append(error)


def test_a_replica_that_gives_up_fails_the_model_once_and_refuses_later_requests(tiny_tokenizer):
    replicas = GivingUpReplicas()
    client = EngineClient(CORE, replicas, 600.0, replicas)  # type: ignore[arg-type]
    told: list[Health] = []
    client.on_health = told.append
    assert replicas.on_health is not None
    replicas.on_health()
    replicas.on_health()
    assert len(replicas.failed_with) == 1 and "replica 1 failed 3 starts" in replicas.failed_with[0].message
    assert len(told) == 2 and client.failure is not None
    client.submit(work_for(tiny_tokenizer, "too late", "late"))
    news = client.take(["late"])["late"]
    assert news.failure is not None and "replica 1 failed 3 starts" in news.failure.message
    assert replicas.calls == []  # never handed to the replicas


def test_a_request_released_while_its_compile_hands_it_over_is_aborted_in_the_engine(tiny_tokenizer):
    engine = RecordingEngine()
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    work = work_for(tiny_tokenizer, "constrained", "c")
    work.compiling, future = pending()
    client.submit(work)
    hand_over = client._to_engine

    def released_meanwhile(w: Work) -> None:  # the frontend's thread releases it just before the hand-over
        assert client.release(w.request_id) is True
        hand_over(w)

    client._to_engine = released_meanwhile  # type: ignore[method-assign]
    future.set_result(None)
    submitted = engine.calls.index(("submit", "c"))
    assert ("abort", "c") in engine.calls[submitted:]  # aborted once in the engine: not left to run for nobody


class SlowBackend(ScriptedBackend):
    """Each decode call takes a while (a busy device): a request that wants a slot waits."""

    def decode(self, slots):
        time.sleep(0.01)
        return super().decode(slots)


def test_a_request_without_a_slot_past_max_queue_wait_is_a_503_with_retry_after(tiny_tokenizer):
    """Issue 42, item 2: bounded waits. The slot's holder is untouched; the waiting one is taken out
    of the engine (it never gets the slot) and answered Overloaded, which says when to retry."""
    backend = SlowBackend(tiny_tokenizer, n_slots=1)
    client = EngineClient(CORE, StepEngine(backend, 10_000), 600.0, max_queue_wait_s=0.2)  # type: ignore[arg-type]
    client.start()
    try:
        client.submit(work_for(tiny_tokenizer, "holding the slot", "holder", max_new_tokens=2000, ignore_eos=True))
        client.submit(work_for(tiny_tokenizer, "waiting for it", "waiter", max_new_tokens=8))
        got = drain(client, ["waiter"], limit_s=20)
        failure = got["waiter"][-1].failure
        assert isinstance(failure, Overloaded) and failure.status == 503 and failure.retry_after_s == 1
        assert failure.reason == "queue_wait" and "max_queue_wait_s" in failure.message
        assert client.knows("holder") and client.engine.occupied == 1  # the holder generates on
        after = client.steps
        while client.steps < after + 2:  # the abort is applied at the start of a step
            client.engine.wait([], client.steps, 1.0)
        assert client.engine.waiting == 0  # the waiter left the queue without ever getting the slot
    finally:
        client.release("holder")
        client.stop()


# -- confirm_client: TorchServe's requests wait for a slot here, and go on when their client is there
class SlottedEngine(RecordingEngine):
    """A recording engine with `slots` slots, `busy` of them taken."""

    def __init__(self, slots: int, busy: int) -> None:
        super().__init__()
        self.slots, self.busy = slots, busy
        self.occupied = self.waiting = 0

    @property
    def free_slots(self) -> int:
        return self.slots - self.busy


def test_a_gated_request_is_asked_when_a_slot_is_free_and_reaches_the_engine_when_confirmed(tiny_tokenizer):
    engine = SlottedEngine(slots=2, busy=2)
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    client.submit(work_for(tiny_tokenizer, "first", "a"), confirm_client=True)
    client.submit(work_for(tiny_tokenizer, "second", "b"), confirm_client=True)
    assert client.take(["a", "b"]) == {} and engine.calls == [] and client.waiting == 2
    engine.busy = 1  # one slot frees: the first come is asked, not the second
    news = client.take(["a", "b"])
    assert list(news) == ["a"] and news["a"].ask_client and news["a"].updates == []
    assert client.take(["a", "b"]) == {}  # asked once; the asked one's slot counts as taken
    client.confirm("a")
    assert engine.calls == [("submit", "a"), ("admissions_done",)]
    assert client.waiting == 1


def test_a_gated_request_released_before_its_confirmation_never_reaches_the_engine(tiny_tokenizer):
    engine = SlottedEngine(slots=1, busy=0)
    client = EngineClient(CORE, engine, 600.0)  # type: ignore[arg-type]
    client.submit(work_for(tiny_tokenizer, "gone", "g"), confirm_client=True)
    client.submit(work_for(tiny_tokenizer, "next", "n"), confirm_client=True)
    assert list(client.take(["g", "n"])) == ["g"]  # free at once: asked at once
    assert client.release("g") is True and engine.calls == []  # its client left: no abort needed
    assert client.confirming is False
    assert list(client.take(["n"])) == ["n"]  # its place goes to the next one
    client.confirm("n")
    assert engine.calls == [("submit", "n"), ("admissions_done",)]


def test_a_gated_request_gets_its_503_while_it_waits_not_once_asked(tiny_tokenizer):
    engine = SlottedEngine(slots=1, busy=1)
    client = EngineClient(CORE, engine, 600.0, max_queue_wait_s=0.0)  # type: ignore[arg-type]
    client.submit(work_for(tiny_tokenizer, "waits", "w"), confirm_client=True)
    news = client.take(["w"])["w"]
    assert isinstance(news.failure, Overloaded) and not news.ask_client and engine.calls == []
    engine.busy = 0
    client.submit(work_for(tiny_tokenizer, "asked", "a"), confirm_client=True)
    assert client.take(["a"])["a"].ask_client
    assert client.take(["a"]) == {}  # its response is open: no 503 under it, it gets its slot
