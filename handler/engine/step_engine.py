"""The continuous-batching engine: sequences join and leave the running batch between steps.

One step runs one plan (`SlotScheduler.plan`, plan.py): admit waiting sequences into free
slots and prefill them, then decode every live slot, the just-prefilled ones included
(transformers-neuronx overwrites position 0 of any live slot left out of a decode call). A
decode row may take up to its `max_tokens` tokens (1 unless the backend's `tokens_per_step`
is more; never past the sequence's length); the backend answers each row with the list of
tokens it accepted. The tokens go through their `Sequence` (EOS, stop strings, length are
decided there, the tokens after an end dropped); a sequence that ends frees its slot before
the next step.

No TorchServe here. Callers `submit` sequences, `abort` them by id, and `take` what each
produced since the last take (`Update`). With `start()` the steps run on a thread of
their own, so the next step runs while the caller ships this step's tokens (vLLM's async
output processing); without it the caller runs `step()` itself. Backend calls come from
one thread at a time; whatever a backend raises fails the sequences of that call only.

Waiting for arrivals: with the steps on their own thread, the next step starts before the
caller (the frontend's next call) has handed over what arrived during the last one, so a
newcomer would wait a whole step more for its prefill. When a slot is free for it, the engine
holds the next step until the caller says it has admitted what it had (`admissions_done`), for
at most `admission_wait` of the last step's time, and only while the caller's calls usually
come within that. A hold costs a round trip on every running stream's step, so it is spent
where a newcomer is likely: in the few steps after a slot was freed (a client that got its
answer sends its next request: chat turns, agents, closed-loop benchmarks); a lone stream,
whose next step nobody else waits for, is never held.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

from handler import failpoints
from handler.backends.base import Backend
from handler.engine.between_steps import BetweenSteps, failed, run_jobs, run_unloads
from handler.engine.outbox import Outboxes, Update
from handler.engine.plan import Admission
from handler.engine.scheduler import SlotScheduler
from handler.engine.sequence import Sequence
from handler.engine.speculation import Speculator
from handler.errors import EngineError, InvalidRequest, ServingError
from handler.lora.adapters import AdapterError
from handler.request import DecodeRow, SlotRequestError, TokenChoice

logger = logging.getLogger(__name__)


# How fast the caller's smoothed gap follows a new one (an exponential moving average).
GAP_SMOOTHING = 0.2
# Steps after a slot was freed during which the next step may be held for a newcomer.
HOLD_STEPS_AFTER_RELEASE = 3


@dataclass(frozen=True)
class StepRecord:
    """Timing of one engine step, for the metrics. The host's share of the step, by stage:
    `sampling_s` (inside the backend calls: choosing tokens from logits) and `detokenize_s`
    (after them: each Sequence's detokenizer, stop strings and end checks). `decoded` counts
    the rows of the decode call, `decoded_tokens` the tokens it gave them (as many as the rows
    unless the backend gives a row several a step; a row whose answer was refused gives none).
    Speculation (`speculating`: the engine proposes, or its backend drafts): `proposed_tokens` tokens
    were proposed over `proposing_rows` rows, and `accepted_tokens` of them taken."""

    prefill_s: float | None
    decode_s: float | None
    prefilled: int
    decoded: int
    occupied: int
    waiting: int
    sampling_s: float = 0.0
    detokenize_s: float = 0.0
    decoded_tokens: int = 0
    proposing_rows: int = 0
    proposed_tokens: int = 0
    accepted_tokens: int = 0
    speculating: bool = False


class StepEngine:
    def __init__(
        self,
        backend: Backend,
        prefill_token_budget: int,
        clock: Callable[[], float] = time.perf_counter,
        admission_wait: float = 0.0,
        max_adapters: int | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.backend = backend
        # Speculation: each decode row's guessed next tokens (speculation.py), unless the backend drafts its own.
        self.speculator = None if backend.draft_tokens else speculator
        self.speculating = self.speculator is not None or backend.draft_tokens > 0
        self.scheduler: SlotScheduler[Sequence] = SlotScheduler(backend.n_slots, prefill_token_budget, max_adapters)
        self._clock = clock
        self._changed = threading.Condition()  # guards everything below; notified after each step
        self._outboxes = Outboxes(self._changed, clock)
        self._aborts: list[str] = []
        self._failure: ServingError | None = None  # fail_all(): applied at the start of the next step
        self._between = BetweenSteps()  # adapter loads and unloads, before the next step's plan
        self._records: list[StepRecord] = []
        self._sampling_s = self._detokenize_s = 0.0  # this step's host time so far, by stage
        self._decoded_tokens = 0  # tokens this step's decode gave
        self._speculated = _Speculated()  # this step's proposals and what they gave
        self.steps = 0
        self._step_started: float | None = None  # while a step runs
        self._thread: threading.Thread | None = None
        self._stopping = False
        # Holding a step for the caller's admissions (see the module's docstring).
        self.admission_wait = admission_wait  # the longest hold, as a fraction of the last step's time
        self._last_step_s = 0.0
        self._step_ended_at: float | None = None
        self._admitted_since_step = True  # the caller's admissions since the last step ended
        self._caller_gap_s: float | None = None  # a step's end to the caller's admissions, smoothed
        self._steps_since_release = HOLD_STEPS_AFTER_RELEASE + 1  # steps ended since a slot was freed
        # Called (from the stepping thread) after a step that left the engine idle, e.g. one that
        # ran a cancelled request to its end with no frontend call to follow: the gauges say 0 then.
        self.on_idle: Callable[[], None] | None = None
        # Called (from the stepping thread) after every step that had work to do: a replica process
        # sends what the step produced to its worker from here (handler/replicas/child.py).
        self.on_step: Callable[[], None] | None = None

    # -- the caller's side -------------------------------------------------------------
    def submit(self, sequence: Sequence) -> None:
        with self._changed:
            self._outboxes.open(sequence)
            self.scheduler.add(sequence.request_id, len(sequence.prompt_ids), sequence, sequence.request.adapter)
            self._changed.notify_all()

    def abort(self, request_id: str) -> None:
        """The client is gone: its slot is freed at the start of the next step."""
        with self._changed:
            if request_id in self._outboxes:
                self._aborts.append(request_id)
                self._changed.notify_all()

    def fail_all(self, error: ServingError) -> None:
        """End every sequence in the engine, waiting or running, with `error` at the start of
        the next step (the drain deadline passed); they end as if a step had failed."""
        with self._changed:
            if not self.scheduler.idle:
                self._failure = error
                self._changed.notify_all()

    def admissions_done(self) -> None:
        """The caller has submitted everything it had (a frontend call's new arrivals): a step held
        for it may start. The first such call after a step tells how long the caller takes."""
        with self._changed:
            if not self._admitted_since_step and self._step_ended_at is not None:
                gap = self._clock() - self._step_ended_at
                smoothed = self._caller_gap_s
                self._caller_gap_s = gap if smoothed is None else smoothed + GAP_SMOOTHING * (gap - smoothed)
            self._admitted_since_step = True
            self._changed.notify_all()

    def load_adapter(self, name: str, path: Path, max_rank: int) -> Future[None]:
        """Check and load a LoRA adapter between steps, on the stepping thread (now, on this one,
        when the caller steps the engine itself); the future says how it went."""
        with self._changed:
            if name in self._between.unloading:
                return failed(
                    AdapterError(
                        f"LoRA adapter {name!r} is still being unloaded: requests that named it are running; load it "
                        "again when they have ended"
                    )
                )

            def load() -> None:
                self.backend.install_adapter(name, path, max_rank)

            future = self._between.add(load)
            self._changed.notify_all()
        if self._thread is None:
            self._run_between_steps()
        return future

    def unload_adapter(self, name: str) -> None:
        """Forget a LoRA adapter once no sequence, waiting or running, names it (the caller stopped
        new ones from naming it first)."""
        with self._changed:
            self._between.unloading.add(name)
            self._changed.notify_all()
        if self._thread is None:
            self._run_between_steps()

    def take(self, request_ids: Iterable[str]) -> dict[str, Update]:
        """The text each request produced since the last take, and whether it ended; a
        request that ended is forgotten once taken."""
        return self._outboxes.take(request_ids)

    def wait(self, request_ids: Iterable[str], after_step: int, timeout_s: float) -> None:
        """Block until a request has something to take, or a step after `after_step` ended
        (so new arrivals can join soon), or the timeout."""
        self._outboxes.wait(request_ids, lambda: self.steps > after_step, timeout_s)

    def take_records(self) -> list[StepRecord]:
        """The records of the steps since the last take (the metrics read them once)."""
        with self._changed:
            records, self._records = self._records, []
        return records

    def step_running_for(self) -> float:
        """Seconds the current step has been running; 0 between steps."""
        started = self._step_started
        return 0.0 if started is None else self._clock() - started

    @property
    def slots(self) -> int:
        return self.scheduler.n_slots

    @property
    def free_slots(self) -> int:
        """Counts the slots of aborted sequences as free: the next step frees them first."""
        aborted = sum(self.scheduler.knows(r) for r in list(self._aborts))
        return max(0, self.scheduler.n_slots - self.scheduler.occupied - self.scheduler.waiting + aborted)

    @property
    def occupied(self) -> int:
        return self.scheduler.occupied

    @property
    def waiting(self) -> int:
        return self.scheduler.waiting

    # -- the thread ---------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="step-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not (self._stopping or self._busy):
                    self._changed.wait()
                if self._stopping:
                    return
                self._hold_for_admissions()
            try:
                self.step()
            except Exception:  # step() answers failures per sequence; this is a bug: keep serving
                logger.exception("engine step failed")

    @property
    def _busy(self) -> bool:
        """Under the lock: a step has something to do."""
        return not self.scheduler.idle or bool(self._aborts) or self._failure is not None or bool(self._between)

    def holds_next_step(self) -> bool:
        """Whether the next step would wait for the caller's admissions: a slot is free for a
        newcomer, the caller has not come since the last step, and it usually comes in time."""
        limit = self.admission_wait * self._last_step_s
        if limit <= 0 or self._admitted_since_step or not self.scheduler.unclaimed_slots:
            return False
        if self._steps_since_release > HOLD_STEPS_AFTER_RELEASE or self.scheduler.occupied < 2:
            return False  # no newcomer likely, or no other stream to delay: the caller's call joins the step
        return self._caller_gap_s is None or self._caller_gap_s <= limit

    def _hold_for_admissions(self) -> None:
        """Under the lock: wait for the caller's admissions before the next step, if it is worth it."""
        if not self.holds_next_step():
            return
        deadline = self._clock() + self.admission_wait * self._last_step_s
        while not (self._admitted_since_step or self._stopping):
            left = deadline - self._clock()
            if left <= 0:
                return
            self._changed.wait(left)

    # -- one step ------------------------------------------------------------------------
    def step(self) -> bool:
        """Run one step; False when there was nothing to do."""
        self._step_started = self._clock()
        busy = self._busy
        try:
            return self._step()
        finally:
            self._step_started = None
            if busy and self.on_step is not None:
                try:
                    self.on_step()
                except Exception:
                    logger.exception("on_step failed")
            if busy and self.on_idle is not None and self.scheduler.idle:
                try:
                    self.on_idle()
                except Exception:
                    logger.exception("on_idle failed")

    def _step(self) -> bool:
        self._run_between_steps()
        with self._changed:
            released = self._apply_aborts() + self._apply_failure()
            plan = self.scheduler.plan(_tokens_left, max(1, self.backend.tokens_per_step))
        for slot in released:
            self._release(slot)
        if plan.empty:
            self._finish_step(None, None, 0, 0)
            return bool(released)
        self._sampling_s = self._detokenize_s = 0.0
        self._decoded_tokens = 0
        self._speculated = _Speculated()
        prefill_s = self._prefill(list(plan.prefill)) if plan.prefill else None
        live = dict(self.scheduler.running())  # after the prefill: without the sequences it ended
        if self.speculator is not None:
            self.speculator.retain(sequence.request_id for sequence in live.values())
        rows = [(self._proposed(row, live[row.slot]), live[row.slot]) for row in plan.decode_rows(live)]
        decode_s = self._decode(rows) if rows else None
        self._finish_step(prefill_s, decode_s, len(plan.prefill), len(rows))
        self._run_between_steps()  # an adapter whose last sequence ended now goes now, not at the next arrival
        return True

    def _proposed(self, row: DecodeRow, sequence: Sequence) -> DecodeRow:
        """The row with the tokens the speculator guesses follow its text, as many as it may take
        beyond the one it always gets."""
        if self.speculator is None or row.max_tokens < 2:
            return row
        proposal = self.speculator.propose(sequence.request_id, sequence.token_history(), row.max_tokens - 1)
        return dataclasses.replace(row, proposal=proposal) if proposal else row

    def _run_between_steps(self) -> None:
        with self._changed:
            unloads, jobs = self._between.take(self.scheduler.uses_adapter)
        run_unloads(unloads, self.backend.unload_adapter)
        run_jobs(jobs)

    def _apply_aborts(self) -> list[int]:
        released = []
        for request_id in self._aborts:
            box = self._outboxes.pop(request_id)
            dropped = self.scheduler.abort(request_id)
            if dropped is not None and dropped[0] is not None:
                released.append(dropped[0])
            if box is not None:
                logger.info("request %s cancelled by its client", request_id)
        self._aborts.clear()
        return released

    def _apply_failure(self) -> list[int]:
        error, self._failure = self._failure, None
        if error is None:
            return []
        failed, released = 0, []
        for request_id, box in self._outboxes.items():
            dropped = None if box.ended else self.scheduler.abort(request_id)
            if dropped is None:
                continue
            box.sequence.fail(error)
            box.ended = True
            failed += 1
            if dropped[0] is not None:
                released.append(dropped[0])
        logger.info("%d sequence(s) ended: %s", failed, error.message)
        return released

    def _prefill(self, admitted: list[Admission[Sequence]]) -> float:
        started = self._clock()
        for a in admitted:
            a.item.admitted_at = started
        try:
            choices = self.backend.prefill([a.item.slot_request(a.slot) for a in admitted])
        except SlotRequestError as exc:  # one request's fault: it fails alone, the others go again
            bad = [a for a in admitted if a.slot == exc.slot]
            rest = [a for a in admitted if a.slot != exc.slot]
            if not bad:
                self._fail([(a.slot, a.item) for a in admitted], exc, "prefill")
                return self._clock() - started
            self._fail([(a.slot, a.item) for a in bad], InvalidRequest(str(exc), exc.param), "prefill")
            for a in rest:
                self._release(a.slot)
            return self._clock() - started + (self._prefill(rest) if rest else 0.0)
        except Exception as exc:
            self._fail([(a.slot, a.item) for a in admitted], exc, "prefill")
            return self._clock() - started
        elapsed = self._clock() - started
        self._sampling_s += self.backend.sampling_s
        if len(choices) != len(admitted):
            error = RuntimeError(f"the backend returned {len(choices)} tokens for {len(admitted)} prefills")
            self._fail([(a.slot, a.item) for a in admitted], error, "prefill")
            return elapsed
        self._deliver([(a.slot, a.item, 1) for a in admitted], [[choice] for choice in choices])
        return elapsed

    def _decode(self, rows: list[tuple[DecodeRow, Sequence]]) -> float:
        started = self._clock()
        live = [(row.slot, s) for row, s in rows]
        try:
            failpoints.check_decode((s.request.prompt, s.completion_tokens) for _, s in live)
            tokens = self.backend.decode_plan([row for row, _ in rows])
        except SlotRequestError as exc:  # one row's fault: it fails alone, the others decode again
            bad = [(slot, s) for slot, s in live if slot == exc.slot]
            rest = [(row, s) for row, s in rows if row.slot != exc.slot]
            if not bad:
                self._fail(live, exc, "decode")
                return self._clock() - started
            self._fail(bad, InvalidRequest(str(exc), exc.param), "decode")
            return self._clock() - started + (self._decode(rest) if rest else 0.0)
        except Exception as exc:
            self._fail(live, exc, "decode")
            return self._clock() - started
        elapsed = self._clock() - started
        self._sampling_s += self.backend.sampling_s
        if not isinstance(tokens, (list, tuple)) or len(tokens) != len(rows):
            count = len(tokens) if isinstance(tokens, (list, tuple)) else type(tokens).__name__
            self._fail(live, RuntimeError(f"the backend answered {count} rows for {len(rows)} decode rows"), "decode")
            return elapsed
        self._count_speculation(rows, tokens)
        accepted = self._deliver([(row.slot, s, row.max_tokens) for row, s in rows], tokens)
        self._decoded_tokens += accepted
        return elapsed

    def _count_speculation(self, rows: list[tuple[DecodeRow, Sequence]], tokens: list[list[TokenChoice]]) -> None:
        """Each row's proposal (the engine's, or the backend's own drafts) and how much of it the
        backend took: for the metrics and the speculator's back-off."""
        if not self.speculating:
            return
        drafts = self.backend.draft_tokens
        for (row, sequence), got in zip(rows, tokens, strict=True):
            proposed = min(drafts, row.max_tokens - 1) if drafts else len(row.proposal)
            if not proposed or not _fits(got, row.max_tokens):
                continue
            accepted = min(len(got) - 1, proposed)
            self._speculated.add(proposed, accepted)
            if self.speculator is not None:
                self.speculator.observe(sequence.request_id, proposed, accepted)

    def _deliver(self, rows: list[tuple[int, Sequence, int]], tokens: list[list[TokenChoice]]) -> int:
        """Each row's tokens (slot, sequence, the most it may take) into its sequence; a row
        answered with no token or more than it may take fails alone. The tokens delivered."""
        bad = {i for i, got in enumerate(tokens) if not _fits(got, rows[i][2])}
        for i in sorted(bad):
            slot, sequence, most = rows[i]
            count = len(tokens[i]) if isinstance(tokens[i], (list, tuple)) else type(tokens[i]).__name__
            error = EngineError(f"generation failed: the backend gave slot {slot} {count} tokens, not 1 to {most}")
            self._fail([(slot, sequence)], error, "step")
        if bad:
            keep = [i for i in range(len(rows)) if i not in bad]
            rows, tokens = [rows[i] for i in keep], [tokens[i] for i in keep]
        ended = []
        started = self._clock()
        deltas = [sequence.take(*got) for (_, sequence, _), got in zip(rows, tokens, strict=True)]
        self._detokenize_s += self._clock() - started
        with self._changed:
            for (slot, sequence, _), delta in zip(rows, deltas, strict=True):
                box = self._outboxes.get(sequence.request_id)
                if box is not None and delta:
                    box.pending.append(delta)
                if sequence.finished:
                    ended.append(slot)
                    self.scheduler.finish(sequence.request_id)
                    if box is not None:
                        box.ended = True
            self._changed.notify_all()  # first tokens go out as soon as the prefill is done, not after the decode
        for slot in ended:
            self._release(slot)
        return sum(len(got) for got in tokens)

    def _fail(self, rows: list[tuple[int, Sequence]], exc: BaseException, what: str) -> None:
        logger.error("%s failed for %d sequence(s)", what, len(rows), exc_info=exc)
        error = exc if isinstance(exc, ServingError) else EngineError(f"generation failed: {exc}")
        with self._changed:
            for _, sequence in rows:
                sequence.fail(error)
                self.scheduler.finish(sequence.request_id)
                box = self._outboxes.get(sequence.request_id)
                if box is not None:
                    box.ended = True
        for slot, _ in rows:
            self._release(slot)

    def _release(self, slot: int) -> None:
        self._steps_since_release = 0
        try:
            self.backend.release(slot)
        except Exception:
            logger.exception("releasing slot %d failed", slot)

    def _finish_step(self, prefill_s: float | None, decode_s: float | None, prefilled: int, decoded: int) -> None:
        with self._changed:
            if prefilled or decoded:
                self.steps += 1
                now = self._clock()
                if self._step_started is not None:
                    self._last_step_s = now - self._step_started
                self._step_ended_at = now
                self._admitted_since_step = False
                self._steps_since_release += 1
                self._records.append(
                    StepRecord(
                        prefill_s,
                        decode_s,
                        prefilled,
                        decoded,
                        self.scheduler.occupied,
                        self.scheduler.waiting,
                        self._sampling_s,
                        self._detokenize_s,
                        self._decoded_tokens,
                        *self._speculated.figures(),
                        self.speculating,
                    )
                )
                del self._records[:-1000]  # nobody drains them outside TorchServe
            self._changed.notify_all()


@dataclass
class _Speculated:
    """One step's proposals: the rows that proposed, the tokens proposed, the tokens taken."""

    rows: int = 0
    proposed: int = 0
    accepted: int = 0

    def add(self, proposed: int, accepted: int) -> None:
        self.rows += 1
        self.proposed += proposed
        self.accepted += accepted

    def figures(self) -> tuple[int, int, int]:
        return self.rows, self.proposed, self.accepted


def _tokens_left(sequence: Sequence) -> int:
    return sequence.tokens_left


def _fits(tokens: object, most: int) -> bool:
    """A row's answer is a list of 1 to `most` tokens."""
    return isinstance(tokens, (list, tuple)) and 1 <= len(tokens) <= most
