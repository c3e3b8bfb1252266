"""The hand-over between the engine client (handler/core/engine_client.py) and the asyncio
event loop.

Each request is handed to the engine client the moment it is prepared, and one dispatcher
thread waits on the client for every request in flight and passes each request's news to its
asyncio queue, one wake-up of the loop per step whatever the number of streams. A client that
goes away releases its request: the engine frees its slots at its next step.
"""

from __future__ import annotations

import asyncio
import logging
import threading

from handler.core.engine_client import EngineClient
from handler.core.preparation import Work
from handler.core.response import News

logger = logging.getLogger(__name__)

# Longest the dispatcher waits before it looks again (the engine client's step watchdog and held
# constraints are checked then; news wakes it at once).
WAIT_CAP_S = 0.5


class EngineBridge:
    def __init__(self, client: EngineClient, loop: asyncio.AbstractEventLoop) -> None:
        self.client = client
        self._loop = loop
        self._lock = threading.Lock()
        self._queues: dict[str, asyncio.Queue[News]] = {}  # request id -> its queue
        self._has_work = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._dispatch, name="frontend-dispatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, work: Work) -> asyncio.Queue[News]:
        """Hand a prepared request over; its news arrives on the returned queue."""
        queue: asyncio.Queue[News] = asyncio.Queue()
        with self._lock:
            self._queues[work.request_id] = queue
            self._has_work.notify_all()
        self.client.submit(work)
        return queue

    def release(self, work: Work) -> bool:
        """The response is over (or its client went away); whether the request was still generating."""
        with self._lock:
            self._queues.pop(work.request_id, None)
        return self.client.release(work.request_id)

    @property
    def in_flight(self) -> int:
        return self.client.in_flight

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
                self.client.wait(ids, self.client.steps, WAIT_CAP_S)
                news = self.client.take(ids)
            except Exception:  # a bug; keep dispatching
                logger.exception("taking the engine's news failed")
                continue
            with self._lock:
                deliveries = [(self._queues[i], n) for i, n in news.items() if i in self._queues]
            if deliveries:
                self._loop.call_soon_threadsafe(_deliver, deliveries)


def _deliver(deliveries: list[tuple[asyncio.Queue[News], News]]) -> None:
    for queue, news in deliveries:
        queue.put_nowait(news)
