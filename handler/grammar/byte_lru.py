"""A least-recently-used cache bounded by the bytes of what it holds, for what requests bring in
(grammar texts, compiled matchers): a count bound lets a client who sends large distinct schemas
grow the worker without limit (320 distinct 1 MB schemas grew one from 495 MB to 2.8 GB)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any


class ByteLRU:
    """Thread-safe. An entry larger than the whole budget is not kept (its caller still has it)."""

    def __init__(self, max_bytes: int, after_evict: Callable[[int], None] | None = None) -> None:
        self.max_bytes = max_bytes
        self._after_evict = after_evict  # called with the bytes an insertion or resize evicted
        self.bytes = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key: Hashable, value: Any, size: int) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1]
            if size > self.max_bytes:
                return
            self._entries[key] = (value, size)
            self.bytes += size
            evicted = self._evict()
        self._evicted(evicted)

    def resize(self, max_bytes: int) -> None:
        with self._lock:
            self.max_bytes = max_bytes
            evicted = self._evict()
        self._evicted(evicted)

    def __len__(self) -> int:
        return len(self._entries)

    def _evict(self) -> int:
        evicted = 0
        while self.bytes > self.max_bytes and self._entries:
            _, (_, size) = self._entries.popitem(last=False)
            self.bytes -= size
            evicted += size
        return evicted

    def _evicted(self, evicted: int) -> None:
        if evicted and self._after_evict is not None:
            self._after_evict(evicted)
