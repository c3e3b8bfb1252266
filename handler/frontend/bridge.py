"""The hand-over between the engine's stepping thread and the asyncio event loop.

Each request's sequences are submitted the moment the request is prepared (the engine's next
step admits them: no frontend round trip; a step the engine holds for a likely newcomer, as a
closed-loop client's next request, starts as soon as one arrives), and one dispatcher thread waits on the engine's
outboxes and passes every update to the asyncio queue of the request it belongs to. A client
that goes away aborts its sequences: the engine frees their slots at the start of its next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterable

from handler.engine.interface import Engine
from handler.engine.outbox import Update
from handler.engine.sequence import Sequence
from handler.errors import ServingError

logger = logging.getLogger(__name__)

# Longest the dispatcher waits on the engine before it looks again (new requests wake it at the
# engine's next step anyway).
WAIT_CAP_S = 0.5


class EngineBridge:
    def __init__(self, engine: Engine, loop: asyncio.AbstractEventLoop) -> None:
        self.engine = engine
        self._loop = loop
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue[Update]] = {}  # sequence id -> its request's queue
        self._has_work = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._dispatch, name="frontend-dispatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, sequences: Iterable[Sequence]) -> asyncio.Queue[Update]:
        """Hand a request's sequences to the engine; its updates arrive on the returned queue."""
        queue: asyncio.Queue[Update] = asyncio.Queue()
        batch = list(sequences)
        with self._lock:
            for sequence in batch:
                self._queues[sequence.request_id] = queue
            self._has_work.notify_all()
        for sequence in batch:
            self.engine.submit(sequence)
        self.engine.admissions_done()  # a step held for a newcomer may start: here it is
        return queue

    def abort(self, sequences: Iterable[Sequence]) -> None:
        """The client went away (or the request ended early): free its slots at the next step."""
        for sequence in sequences:
            with self._lock:
                known = self._queues.pop(sequence.request_id, None) is not None
            if known:
                self.engine.abort(sequence.request_id)

    @property
    def in_flight(self) -> int:
        """Sequences submitted and not ended (waiting for a slot or decoding)."""
        with self._lock:
            return len(self._queues)

    def fail_all(self, error: ServingError) -> None:
        self.engine.fail_all(error)

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
            self._has_work.notify_all()
        self._thread.join(timeout=5)

    def _dispatch(self) -> None:
        while True:
            with self._lock:
                while not self._queues and not self._stopping:
                    self._has_work.wait()
                if self._stopping:
                    return
                ids = list(self._queues)
            try:
                self.engine.wait(ids, self.engine.steps, WAIT_CAP_S)
                updates = self.engine.take(ids)
            except Exception:  # a bug; keep dispatching
                logger.exception("taking the engine's updates failed")
                continue
            deliveries = []
            with self._lock:
                for sequence_id, update in updates.items():
                    queue = self._queues.get(sequence_id)
                    if update.ended:
                        self._queues.pop(sequence_id, None)
                    if queue is not None:
                        deliveries.append((queue, update))
            if deliveries:  # one wake-up of the loop per step, whatever the number of streams
                self._loop.call_soon_threadsafe(_deliver, deliveries)


def _deliver(deliveries: list[tuple[asyncio.Queue[Update], Update]]) -> None:
    for queue, update in deliveries:
        queue.put_nowait(update)
