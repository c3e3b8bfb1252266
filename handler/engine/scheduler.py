"""Slot scheduler for continuous batching: pure Python, no model, no threads.

A fixed pool of `n_slots` slots (the compiled batch size on Neuron) and a FIFO of
waiting sequences. Each engine step asks `plan()` for the step's plan (plan.py): which
waiting sequences to prefill now (`schedule()`), then every running one as a decode row
(`running()`) with the tokens it may take this step. A waiting sequence is
admitted as soon as a slot is free, in arrival order, while the step's prompt tokens
stay within `prefill_token_budget` (the first one always goes, however long): the
budget bounds how long one step's prefills pause the running streams, at the price of
admitting a burst of long prompts over several steps. A sequence that finishes, fails
or is aborted frees its slot at once (`finish`, `abort`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from handler.engine.plan import Admission, StepPlan
from handler.request import DecodeRow

T = TypeVar("T")

__all__ = ["Admission", "SlotScheduler", "StepPlan"]


@dataclass
class _Waiting(Generic[T]):
    request_id: str
    prompt_tokens: int
    item: T


class SlotScheduler(Generic[T]):
    def __init__(self, n_slots: int, prefill_token_budget: int) -> None:
        if n_slots < 1 or prefill_token_budget < 1:
            raise ValueError("n_slots and prefill_token_budget must be >= 1")
        self.n_slots = n_slots
        self.prefill_token_budget = prefill_token_budget
        self._waiting: deque[_Waiting[T]] = deque()
        self._free: list[int] = list(range(n_slots))  # lowest slot first, for readable logs
        self._running: dict[str, tuple[int, T]] = {}  # request id -> (slot, item), in admission order

    # -- state -------------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def occupied(self) -> int:
        return len(self._running)

    @property
    def unclaimed_slots(self) -> int:
        """Free slots that no waiting sequence takes at the next `schedule()`: room for a newcomer."""
        return max(0, len(self._free) - len(self._waiting))

    @property
    def idle(self) -> bool:
        return not self._waiting and not self._running

    def knows(self, request_id: str) -> bool:
        return request_id in self._running or any(w.request_id == request_id for w in self._waiting)

    def running(self) -> list[tuple[int, T]]:
        """(slot, item) of every running sequence, in admission order: the decode set."""
        return list(self._running.values())

    # -- changes -------------------------------------------------------------------------
    def add(self, request_id: str, prompt_tokens: int, item: T) -> None:
        """Queue a sequence at the back of the FIFO."""
        if self.knows(request_id):
            raise ValueError(f"request {request_id} is already scheduled")
        self._waiting.append(_Waiting(request_id, prompt_tokens, item))

    def schedule(self) -> list[Admission[T]]:
        """Admit waiting sequences into free slots for this step's prefill."""
        admitted: list[Admission[T]] = []
        budget = self.prefill_token_budget
        while self._waiting and self._free:
            head = self._waiting[0]
            if admitted and head.prompt_tokens > budget:
                break
            self._waiting.popleft()
            budget -= head.prompt_tokens
            slot = self._free.pop(0)
            self._running[head.request_id] = (slot, head.item)
            admitted.append(Admission(slot, head.request_id, head.item))
        return admitted

    def plan(self, tokens_left: Callable[[T], int], tokens_per_step: int = 1) -> StepPlan[T]:
        """This step's plan: `schedule()`'s admissions, then a decode row for every running
        sequence, those admitted now included. A row may take `tokens_per_step` tokens, or fewer:
        never more than `tokens_left(item)`, what the sequence may still generate, less the one
        token an admission's prefill gives it first. An admission with nothing left after that
        token (it ends there) gets no decode row."""
        if tokens_per_step < 1:
            raise ValueError(f"tokens_per_step must be >= 1, got {tokens_per_step}")
        admitted = self.schedule()
        new = {a.request_id for a in admitted}
        rows = []
        for request_id, (slot, item) in self._running.items():
            left = tokens_left(item) - (1 if request_id in new else 0)
            if left >= 1:
                rows.append(DecodeRow(slot, min(tokens_per_step, left)))
        return StepPlan(tuple(admitted), tuple(rows))

    def finish(self, request_id: str) -> int | None:
        """A running sequence ended; its slot is free now. Returns the slot (None if not running)."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return None
        self._free.append(entry[0])
        self._free.sort()
        return entry[0]

    def abort(self, request_id: str) -> tuple[int | None, T] | None:
        """Drop a sequence wherever it is: (its freed slot or None if it was waiting, item);
        None when the id is unknown."""
        if request_id in self._running:
            item = self._running[request_id][1]
            return self.finish(request_id), item
        for waiting in self._waiting:
            if waiting.request_id == request_id:
                self._waiting.remove(waiting)
                return None, waiting.item
        return None
