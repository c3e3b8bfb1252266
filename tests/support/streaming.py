"""When each piece of a streamed HTTP response reached the client, and the check that the
first piece came while the server was still generating.

Timestamp pieces as the client iterates them (`timed`), not after reading the whole body:
a server that buffers the completion and sends it at the end still gives many chunks.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def timed(pieces: Iterable[T]) -> Iterator[tuple[float, T]]:
    """Each piece with the `time.perf_counter()` moment the iteration handed it over."""
    for piece in pieces:
        yield time.perf_counter(), piece


def assert_first_arrived_while_generating(started: float, arrivals: Sequence[float], batch_delay_s: float) -> None:
    """The first piece arrived while the rest of the completion was still being generated.

    `started`: when the request was sent; `arrivals`: `time.perf_counter()` per piece, in
    order; `batch_delay_s`: the model's `maxBatchDelay`, which a lone request may wait in the
    frontend before the worker even sees it.

    Streamed: the first piece waits for the batch window, the prompt and a step or so;
    the pieces after it spread over the rest of the generation. Buffered: every piece arrives
    at the end, within a read or two, so the spread is about zero. The check: the first
    piece's wait beyond the batch window is under half of that spread. No duration is fixed:
    a slower (busier) machine stretches both sides; give the request enough tokens that
    generating them takes well over `batch_delay_s`, else buffering could pass as streaming.
    """
    assert len(arrivals) > 2, f"{len(arrivals)} piece(s): the response came in one piece"
    first_wait = arrivals[0] - started - batch_delay_s
    spread = arrivals[-1] - arrivals[0]
    assert first_wait < 0.5 * spread, (
        f"first piece {arrivals[0] - started:.3f} s after the request ({batch_delay_s:.3f} s of it maybe the "
        f"batch window), last {spread:.3f} s after the first: the text came at the end, not while generating"
    )
