"""Which decode rows propose tokens this step, and what: prompt lookup (ngram.py) per row, and the back-off
that stops a row from proposing while its proposals keep failing (docs/speculative.md).

A proposal costs the verify forward a wider row (k + 1 positions instead of 1, for every row of the
step: the batch is padded to its longest row) and gains only what is accepted. A row whose text stops
repeating itself keeps finding short matches that the model rejects, so after r proposals in a row that
took nothing, it sits out the next min(2^r - 1, MAX_SKIP) steps; one accepted token resets it. The
output never depends on it: proposals only decide how many tokens a step may take.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from handler.engine.ngram import NgramProposer

MAX_SKIP = 15  # the longest a row sits out: after 4 fruitless proposals in a row


@dataclass
class _RowRecord:
    misses: int = 0  # proposals in a row that took nothing
    skip: int = 0  # steps left before the row proposes again


class Speculator:
    """The engine's proposals, row by row (keyed by request id)."""

    def __init__(self, proposer: NgramProposer, backoff: bool = False) -> None:
        self.proposer = proposer
        self.backoff = backoff
        self._rows: dict[str, _RowRecord] = {}

    @classmethod
    def of(cls, settings: Any) -> Speculator | None:
        """From `scheduler.speculation` (read by attribute: the engine imports no config); None when off."""
        proposer = NgramProposer.of(settings)
        return None if proposer is None else cls(proposer, settings.backoff)

    def propose(self, request_id: str, history: Sequence[int] | np.ndarray, most: int) -> tuple[int, ...]:
        """Up to `most` tokens to verify after the row's text `history`; none while it backs off."""
        record = self._rows.get(request_id)
        if record is not None and record.skip > 0:
            record.skip -= 1
            return ()
        return self.proposer.propose(history)[:most]

    def observe(self, request_id: str, proposed: int, accepted: int) -> None:
        """What the row's proposal of `proposed` tokens gave: `accepted` of them taken."""
        if not self.backoff or proposed == 0:
            return
        record = self._rows.setdefault(request_id, _RowRecord())
        if accepted > 0:
            record.misses = 0
            return
        record.misses += 1
        record.skip = min(2**record.misses - 1, MAX_SKIP)

    def retain(self, request_ids: Iterable[str]) -> None:
        """Forget the rows not among `request_ids` (the live ones)."""
        live = set(request_ids)
        for request_id in [r for r in self._rows if r not in live]:
            del self._rows[request_id]
