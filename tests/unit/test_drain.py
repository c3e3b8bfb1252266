"""Draining, piece by piece: the watcher's view of the drain order, and how the engines end
what is still in flight at the deadline (handler/serving/drain.py, StepEngine.fail_all,
MicroBatchEngine's interrupt)."""

from __future__ import annotations

from pathlib import Path

from handler.engine.micro_batch import MicroBatchEngine
from handler.engine.sequence import FinishReason, State
from handler.errors import ServiceUnavailable, to_http
from handler.serving import drain
from handler.serving.drain import DrainWatcher
from handler.serving.state import DRAIN_FILE, drained_marker, write_drain
from tests.unit.test_engine import Log, ScriptedBackend, engine_for, make_seq, reply, solo


class Busy:
    def __init__(self) -> None:
        self.value = False

    def __call__(self) -> bool:
        return self.value


def test_the_watcher_marks_the_worker_drained_once_idle_and_forgets_a_withdrawn_order(tmp_path: Path):
    busy = Busy()
    watcher = DrainWatcher(busy, tmp_path)
    watcher.poll()
    assert not watcher.draining and watcher.seconds_left() is None and not watcher.expired
    write_drain(tmp_path, grace_s=60)
    busy.value = True
    for _ in range(5):
        watcher.poll()
    assert watcher.draining and not watcher.expired and 0 < watcher.seconds_left() <= 60
    assert not drained_marker(tmp_path).exists(), "marked drained with a request in flight"
    busy.value = False
    watcher.poll()
    assert not drained_marker(tmp_path).exists(), "one idle poll is not enough"
    watcher.poll()
    assert drained_marker(tmp_path).exists()
    (tmp_path / DRAIN_FILE).unlink()  # the order withdrawn: serving again
    watcher.poll()
    assert not watcher.draining and not drained_marker(tmp_path).exists()


def test_the_deadline_passes(tmp_path: Path):
    watcher = DrainWatcher(Busy(), tmp_path)
    write_drain(tmp_path, grace_s=0)
    watcher.poll()
    assert watcher.draining and watcher.expired and watcher.seconds_left() <= 0


def test_without_a_state_dir_nothing_drains_and_no_thread_runs():
    watcher = DrainWatcher(Busy(), None)
    watcher.start()
    watcher.poll()
    assert watcher._thread is None and not watcher.draining
    watcher.stop()


def test_the_errors_are_503():
    for error in (drain.refused(), drain.cut()):
        assert isinstance(error, ServiceUnavailable)
        assert to_http(error).status == 503 and to_http(error).body["error"]["type"] == "service_unavailable"


def test_fail_all_ends_running_and_waiting_sequences_and_the_engine_serves_on(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=2)
    engine = engine_for(backend)
    ids = ["first", "second", "waiting"]
    for request_id in ids:
        engine.submit(make_seq(tiny_tokenizer, request_id, max_new_tokens=1000, ignore_eos=True))
    log = Log()
    for _ in range(3):
        engine.step()
        log.take(engine, ids)
    sent = dict(log.text)
    assert (engine.occupied, engine.waiting) == (2, 1) and sent["first"]
    engine.fail_all(drain.cut())
    engine.step()
    log.take(engine, ids)
    for request_id in ids:
        sequence = log.ended[request_id].sequence
        assert sequence.state is State.FAILED and sequence.error.message == drain.CUT
        assert log.text.get(request_id, "") == sent.get(request_id, "")  # what was sent stays sent
    assert engine.scheduler.idle and not backend.live and not backend.violations
    assert "waiting" not in backend.prefilled_prompts()
    engine.fail_all(drain.cut())  # an idle engine: nothing to fail, nothing left pending
    engine.submit(make_seq(tiny_tokenizer, "after"))
    while not engine.scheduler.idle:
        engine.step()
        log.take(engine, ["after"])
    assert log.text["after"] == solo(tiny_tokenizer, "after")[0]
    assert log.ended["after"].sequence.finish_reason is FinishReason.EOS


def test_an_interrupt_ends_a_micro_batch_between_steps(tiny_tokenizer):
    backend = ScriptedBackend(tiny_tokenizer, n_slots=4)
    seqs = [make_seq(tiny_tokenizer, p, max_new_tokens=1000, ignore_eos=True) for p in ("one", "two")]
    short = make_seq(tiny_tokenizer, "short", max_new_tokens=2)
    steps = []

    def interrupt():
        steps.append(len(backend.calls))
        return drain.cut() if len(steps) > 5 else None

    sent: dict[str, str] = {}
    MicroBatchEngine(backend, interrupt).run([*seqs, short], lambda s, d: sent.update({s.request_id: d}))
    for sequence in seqs:
        assert sequence.state is State.FAILED and sequence.error.message == drain.CUT
        assert sequence.completion_tokens == 5  # prefill + 4 decodes before the interrupt
    assert short.finish_reason is FinishReason.LENGTH and short.error is None
    assert not backend.live and not backend.violations
    assert reply("short").startswith(short.full_text)
