"""One engine step's plan: which waiting sequences to prefill, then which live slots to decode and
how many tokens each may take. `SlotScheduler.plan` makes it; the `StepEngine` runs it: the
admissions go to the backend's `prefill`, the decode rows still live after it to `decode_plan`.

Room for what comes next: a backend that speculates gives a row up to `max_tokens` tokens a step
(the plan caps them at what the row may still generate, so no row runs past its length), and a
row names its LoRA adapter (`adapter_id`, None today). `DecodeRow` itself is a domain type
(handler/request.py): the backends take it and never see the engine.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Generic, TypeVar

from handler.request import DecodeRow

T = TypeVar("T")


@dataclass(frozen=True)
class Admission(Generic[T]):
    """A waiting sequence given a slot this step."""

    slot: int
    request_id: str
    item: T


@dataclass(frozen=True)
class StepPlan(Generic[T]):
    """One step: prefill `prefill` (in order), then decode `decode`: every running sequence, those
    admitted now included (after their prefill's first token), in admission order."""

    prefill: tuple[Admission[T], ...] = ()
    decode: tuple[DecodeRow, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.prefill and not self.decode

    def decode_rows(self, live: Container[int]) -> tuple[DecodeRow, ...]:
        """The decode rows whose slot is still `live` after the prefill (a prefill that failed
        freed its slots; a sequence that ended at its first token freed its own)."""
        return tuple(row for row in self.decode if row.slot in live)
