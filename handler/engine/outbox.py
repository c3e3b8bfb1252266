"""What each request produced that its caller has not taken yet: the hand-over point between a
thread that produces tokens (the step loop, or a replica's reader) and the caller that ships
them (handler/serving/continuous.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from handler.engine.sequence import Sequence


@dataclass
class Update:
    """What one request produced since the last `take`."""

    sequence: Sequence
    text: str = ""
    ended: bool = False  # finished or failed; nothing follows


@dataclass
class Outbox:
    sequence: Sequence
    pending: list[str] = field(default_factory=list)
    ended: bool = False


class Outboxes:
    """One outbox per request, guarded by the owner's condition `changed`: the owner holds it
    around `open`, `get`, `pop` and `items`; `take` and `wait` take it themselves."""

    def __init__(self, changed: threading.Condition, clock: Callable[[], float] = time.perf_counter) -> None:
        self.changed = changed
        self._clock = clock
        self._boxes: dict[str, Outbox] = {}

    def open(self, sequence: Sequence) -> Outbox:
        if sequence.request_id in self._boxes:
            raise ValueError(f"request {sequence.request_id} is already in the engine")
        box = self._boxes[sequence.request_id] = Outbox(sequence)
        return box

    def get(self, request_id: str) -> Outbox | None:
        return self._boxes.get(request_id)

    def pop(self, request_id: str) -> Outbox | None:
        return self._boxes.pop(request_id, None)

    def items(self) -> Iterator[tuple[str, Outbox]]:
        return iter(list(self._boxes.items()))

    def __len__(self) -> int:
        return len(self._boxes)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._boxes

    def take(self, request_ids: Iterable[str]) -> dict[str, Update]:
        """The text each request produced since the last take, and whether it ended; a
        request that ended is forgotten once taken."""
        out: dict[str, Update] = {}
        with self.changed:
            for request_id in request_ids:
                box = self._boxes.get(request_id)
                if box is None or not (box.pending or box.ended):
                    continue
                out[request_id] = Update(box.sequence, "".join(box.pending), box.ended)
                box.pending.clear()
                if box.ended:
                    del self._boxes[request_id]
        return out

    def wait(self, request_ids: Iterable[str], also: Callable[[], bool], timeout_s: float) -> None:
        """Block until a request has something to take, or `also()` says so, or the timeout."""
        ids = list(request_ids)
        deadline = self._clock() + timeout_s

        def ready() -> bool:
            if also():
                return True
            return any((box := self._boxes.get(i)) is not None and (box.pending or box.ended) for i in ids)

        with self.changed:
            while not ready():
                remaining = deadline - self._clock()
                if remaining <= 0:
                    return
                self.changed.wait(remaining)
