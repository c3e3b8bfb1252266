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

LoRA: a sequence may name an adapter; at most `max_adapters` distinct adapters run at once (what
the backend holds per step: NxD Inference's `max_loras`). A sequence whose adapter would be one
too many waits, and while it waits only base-model sequences (which take no adapter's place) pass
it: the running adapters' rows end, a place frees, and it goes next. First come, first served
within that rule, and no adapter's traffic can starve another's.
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
    adapter: str | None = None


class SlotScheduler(Generic[T]):
    def __init__(self, n_slots: int, prefill_token_budget: int, max_adapters: int | None = None) -> None:
        if n_slots < 1 or prefill_token_budget < 1:
            raise ValueError("n_slots and prefill_token_budget must be >= 1")
        if max_adapters is not None and max_adapters < 1:
            raise ValueError("max_adapters must be >= 1 (None: no LoRA limit)")
        self.n_slots = n_slots
        self.prefill_token_budget = prefill_token_budget
        self.max_adapters = max_adapters
        self._adapter_of: dict[str, str] = {}  # running request id -> its adapter (base rows absent)
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
    def add(self, request_id: str, prompt_tokens: int, item: T, adapter: str | None = None) -> None:
        """Queue a sequence at the back of the FIFO (with the LoRA adapter it runs with)."""
        if self.knows(request_id):
            raise ValueError(f"request {request_id} is already scheduled")
        self._waiting.append(_Waiting(request_id, prompt_tokens, item, adapter))

    @property
    def live_adapters(self) -> set[str]:
        return set(self._adapter_of.values())

    def uses_adapter(self, name: str) -> bool:
        """A sequence, running or waiting, names the adapter."""
        return name in self._adapter_of.values() or any(waiting.adapter == name for waiting in self._waiting)

    def schedule(self) -> list[Admission[T]]:
        """Admit waiting sequences into free slots for this step's prefill."""
        admitted: list[Admission[T]] = []
        budget = self.prefill_token_budget
        live = self.live_adapters
        blocked = False  # a sequence waits for an adapter's place: only base sequences may pass it
        taken: set[str] = set()
        for waiting in self._waiting:
            if not self._free:
                break
            if waiting.adapter is not None:
                if blocked:
                    continue
                if waiting.adapter not in live and self.max_adapters is not None and len(live) >= self.max_adapters:
                    blocked = True
                    continue
            if admitted and waiting.prompt_tokens > budget:
                break
            taken.add(waiting.request_id)
            budget -= waiting.prompt_tokens
            slot = self._free.pop(0)
            self._running[waiting.request_id] = (slot, waiting.item)
            if waiting.adapter is not None:
                self._adapter_of[waiting.request_id] = waiting.adapter
                live.add(waiting.adapter)
            admitted.append(Admission(slot, waiting.request_id, waiting.item))
        if taken:
            self._waiting = deque(w for w in self._waiting if w.request_id not in taken)
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
                rows.append(DecodeRow(slot, min(tokens_per_step, left), self._adapter_of.get(request_id)))
        return StepPlan(tuple(admitted), tuple(rows))

    def finish(self, request_id: str) -> int | None:
        """A running sequence ended; its slot is free now. Returns the slot (None if not running)."""
        entry = self._running.pop(request_id, None)
        if entry is None:
            return None
        self._adapter_of.pop(request_id, None)
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
