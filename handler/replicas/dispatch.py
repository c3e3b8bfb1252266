"""Which replica takes a new request."""

from __future__ import annotations

from collections.abc import Sequence


def choose(loads: Sequence[int | None]) -> int | None:
    """The replica with the fewest sequences (running + waiting), ties to the lowest index.
    `loads[k]` is None while replica k is not serving (starting, restarting); None when no
    replica serves."""
    serving = [(load, index) for index, load in enumerate(loads) if load is not None]
    return min(serving)[1] if serving else None
