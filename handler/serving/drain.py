"""The worker's side of a drain (graceful shutdown; the files are in handler/serving/state.py).

The stop script writes `drain.json` with a deadline. A `DrainWatcher` thread per worker
polls it (one failed open per poll while not draining) and tells the serving code:
- `draining`: new requests get a 503 (`ServiceUnavailable`), requests in flight go on;
- `expired`: the deadline passed, whatever is still in flight ends with an error now.
Once the worker has nothing in flight it writes `drained-<pid>`, which is what the stop
script waits for before it stops TorchServe. The watcher asks the serving object
(`busy`) rather than waiting for a TorchServe call: in static mode nothing runs between
calls, and a continuous worker whose last stream ended gets no further call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Callable
from pathlib import Path

from handler.errors import ServiceUnavailable
from handler.serving.state import Drain, drained_marker, read_drain, state_dir

logger = logging.getLogger(__name__)

POLL_S = 0.1
# Idle on this many polls in a row before `drained-<pid>`: the last reply of a stream is on
# its way to the frontend when the worker's bookkeeping says idle.
IDLE_POLLS = 2

REFUSED = "the server is shutting down (draining) and takes no new requests; retry on another instance"
CUT = "the server is shutting down: the request did not finish within the drain grace period"


def refused() -> ServiceUnavailable:
    """The error a new request gets while the worker drains."""
    return ServiceUnavailable(REFUSED)


def cut() -> ServiceUnavailable:
    """The error a request still in flight at the drain deadline ends with."""
    return ServiceUnavailable(CUT)


class DrainWatcher:
    """Polls the drain order; `busy()` says whether the worker has anything in flight.

    `settle_s`: how long the worker must stay idle before it counts as drained, for a
    frontend that may still hand it queued requests after a pause (static mode: up to
    maxBatchDelay after a batch); those get their 503 instead of being cut by the stop.
    """

    def __init__(
        self, busy: Callable[[], bool], directory: Path | None = None, poll_s: float = POLL_S, settle_s: float = 0.0
    ) -> None:
        self._busy = busy
        self._directory = directory
        self._poll_s = poll_s
        self._polls_needed = max(IDLE_POLLS, math.ceil(round(settle_s / poll_s, 6)) + 1)
        self._drain: Drain | None = None
        self._idle_polls = 0
        self._marked = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @classmethod
    def from_env(cls, busy: Callable[[], bool], settle_s: float = 0.0) -> DrainWatcher:
        """Watches `INF2_STATE_DIR`; without it the worker never drains and no thread runs."""
        return cls(busy, state_dir(), settle_s=settle_s)

    # -- what the serving code asks ------------------------------------------------------
    @property
    def draining(self) -> bool:
        return self._drain is not None

    @property
    def expired(self) -> bool:
        drain = self._drain
        return drain is not None and drain.seconds_left() <= 0

    def seconds_left(self) -> float | None:
        """Seconds to the deadline (<= 0 once passed); None when not draining."""
        drain = self._drain
        return None if drain is None else drain.seconds_left()

    # -- the thread ----------------------------------------------------------------------
    def start(self) -> None:
        if self._directory is None or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="drain-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.poll()
            except Exception:  # a full disk or a vanished directory must not end the watcher
                logger.exception("drain watcher poll failed")

    def poll(self) -> None:
        """Read the order once; mark this worker drained once idle for long enough."""
        if self._directory is None:
            return
        drain = read_drain(self._directory)
        if drain is None:
            if self._drain is not None:
                logger.info("drain order withdrawn: serving again")
                self._unmark()
            self._drain, self._idle_polls = None, 0
            return
        if self._drain is None:
            logger.info("draining: refusing new requests; %.1f s left for those in flight", drain.seconds_left())
        self._drain = drain
        if self._busy():
            self._idle_polls = 0
            return
        self._idle_polls += 1
        if self._idle_polls >= self._polls_needed and not self._marked:
            drained_marker(self._directory).touch()
            self._marked = True
            logger.info("drained: nothing in flight")

    def _unmark(self) -> None:
        if self._marked and self._directory is not None:
            with contextlib.suppress(FileNotFoundError):
                drained_marker(self._directory).unlink()
        self._marked = False
