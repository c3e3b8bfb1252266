"""Request preparation (parse, validate, tokenize: handler/core/preparation.py) off the event loop,
within a share of the process's time.

Behind TorchServe new requests reach the worker with its per-step calls, so a flood of requests
that are refused on receipt is paced by the steps. Here each is prepared as soon as it arrives: four
clients re-sending 0.9 MB schemas that are refused at once (400, `handler.grammar.max_constraint_bytes`)
had them prepared 150 times a second, about 3.5 ms of JSON work each, all of it holding the GIL; the
step loop needs the GIL between its torch calls, and a stream beside them took 6.8 times as long.
So preparation runs on a few threads of its own, and the requests it REFUSES may take at most a
share of the time on average (`--prepare-share`, `SHARE` by default): a bucket of CPU seconds,
`BURST_S` deep, refilled at the share per second, charged only for a preparation that ended in a
refusal (`refused`), and every preparation waits while it is empty. Requests that are served are
never charged (their count is bounded by the in-flight limit, and a long prompt's tokenizing is
legitimate work), so an ordinary load never waits; a flood of refused requests waits its turn, and
the steps go on. With the share at 0.25 the stream took 1.7-3 times as long, at 0.1 1.1-2.5 (2 cores,
shared with others).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

SHARE = 0.1  # of one core's time (one GIL), on average
BURST_S = 0.25  # CPU seconds of preparation that may run back to back before any waits
THREADS = 2


class PreparationBudget:
    """A token bucket of CPU seconds, filled at `share` per second up to `burst_s`. Thread-safe."""

    def __init__(
        self, share: float = SHARE, burst_s: float = BURST_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 < share <= 1:
            raise ValueError(f"the share of the time for preparing requests must be in (0, 1], got {share}")
        self.share = share
        self.burst_s = burst_s
        self._clock = clock
        self._level = burst_s
        self._at = clock()
        self._lock = threading.Lock()

    def wait_s(self) -> float:
        """How long until the bucket holds anything (0: now)."""
        with self._lock:
            self._refill()
            return max(0.0, -self._level / self.share)

    def spend(self, cpu_s: float) -> None:
        with self._lock:
            self._refill()
            self._level -= cpu_s

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self.burst_s, self._level + (now - self._at) * self.share)
        self._at = now


class Preparer:
    """Runs each request's preparation on `threads` threads of its own; the refused ones within `budget`."""

    def __init__(self, budget: PreparationBudget | None = None, threads: int = THREADS) -> None:
        self.budget = budget or PreparationBudget()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prepare")

    async def run(self, prepare: Callable[[], T], refused: Callable[[T], bool]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._within_budget, prepare, refused)

    def _within_budget(self, prepare: Callable[[], T], refused: Callable[[T], bool]) -> T:
        while (wait := self.budget.wait_s()) > 0:
            time.sleep(wait)
        started = time.thread_time()
        result = prepare()
        if refused(result):
            self.budget.spend(time.thread_time() - started)
        return result

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
