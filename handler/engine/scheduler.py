"""Slot scheduler for continuous batching: pure Python, no model, no threads.

A fixed pool of `n_slots` slots (the compiled batch size on Neuron) and a FIFO of
waiting sequences. Each engine step asks `schedule()` which waiting sequences to
prefill now; every running one is decoded (`running()`). A waiting sequence is
admitted as soon as a slot is free, in arrival order, while the step's prompt tokens
stay within `prefill_token_budget` (the first one always goes, however long): the
budget bounds how long one step's prefills pause the running streams, at the price of
admitting a burst of long prompts over several steps. A sequence that finishes, fails
or is aborted frees its slot at once (`finish`, `abort`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Admission(Generic[T]):
    """A waiting sequence given a slot this step."""

    slot: int
    request_id: str
    item: T


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
