"""The stored responses behind `previous_response_id`, `GET /v1/responses/{id}[/input_items]` and
`DELETE /v1/responses/{id}`: one worker's memory, bounded by bytes and by age.

`store: true` (OpenAI's default) keeps a response, its input items and the conversation the next
turn continues from. OpenAI keeps them in a database for 30 days; here they live in one worker's
memory, so the bounds decide what is kept, and a 404 that names the field says why an id is not
here: never stored on this worker, evicted for space, expired, deleted, or too large to store.

What the byte bound counts: the UTF-8 bytes of the compact JSON of the three fields (the size they
have on the wire), computed once per `put`, not Python's memory. Measured with tracemalloc
(CPython, ASCII text as parsed from JSON), Python holds about 1.0x that for 100 KB entries,
1.3-1.7x for conversations of 1-2 KB turns, and up to ~4.5x for entries under 1 KB, where dict and
str headers dominate; text shared between the fields (the last output is in `response` and in
`conversation`) is counted twice but held once, which can bring it under 1x. So for typical turns
the default bound of 256 MiB holds roughly 256-450 MiB of the worker's memory.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from handler.api.json_tree import printable
from handler.errors import NotFound

logger = logging.getLogger(__name__)

# Why each forgotten id is gone, for the last this many ids: ~19 MB at 100,000 (tracemalloc:
# ~94 bytes per `resp_<32 hex>` id, ~91 per OrderedDict entry), a few store-fulls of history.
FORGOTTEN_IDS = 100_000

_ID_SHOWN = 100  # characters of an id quoted back in a 404


@dataclass(frozen=True)
class StoredResponse:
    """One stored response. Shared, not copied, by `get`: treat it and its dicts as read-only."""

    response: dict[str, Any]  # the response object as sent to the client (JSON-able)
    input_items: tuple[dict[str, Any], ...]  # the request's input items, each with an `id`
    conversation: tuple[dict[str, Any], ...]  # chat messages the next turn continues from (opaque here)

    def size(self) -> int:
        """The bytes the store's bound counts: UTF-8 of the compact JSON of the three fields."""
        encoded = json.dumps(
            [self.response, self.input_items, self.conversation], separators=(",", ":"), ensure_ascii=False
        )
        return len(encoded.encode("utf-8", "surrogatepass"))


class Gone(enum.Enum):
    """Why an id that was put is no longer here."""

    EVICTED = "evicted"
    EXPIRED = "expired"
    DELETED = "deleted"
    TOO_LARGE = "too_large"


@dataclass
class _Entry:
    stored: StoredResponse
    size: int
    stored_at: float


class ResponseStore:
    """Responses by id, oldest first; thread-safe (requests are prepared on several threads)."""

    def __init__(
        self,
        max_bytes: int,
        max_age_s: float,
        clock: Callable[[], float] = time.monotonic,
        forgotten_ids: int = FORGOTTEN_IDS,
    ) -> None:
        if max_bytes <= 0 or max_age_s <= 0 or forgotten_ids < 0:
            raise ValueError(f"a store needs positive bounds, not {max_bytes} bytes, {max_age_s} s")
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._clock = clock
        self._forgotten_cap = forgotten_ids
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()  # insertion order is age order
        self._bytes = 0
        self._forgotten: OrderedDict[str, Gone] = OrderedDict()  # bounded: the newest reasons
        self._counts = dict.fromkeys(Gone, 0)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        """Keep `stored`, after dropping the expired entries and then the oldest until it fits. An
        entry larger than the whole bound is not kept (and `get` says so)."""
        size = stored.size()  # outside the lock: encoding 100 KB takes a while
        with self._lock:
            now = self._clock()
            self._drop(response_id)  # a second put of an id replaces it, and it is no longer gone
            self._forgotten.pop(response_id, None)
            self._expire(now)
            if size > self.max_bytes:
                self._forget(response_id, Gone.TOO_LARGE)
            else:
                while self._bytes + size > self.max_bytes:
                    oldest, entry = self._entries.popitem(last=False)
                    self._bytes -= entry.size
                    self._forget(oldest, Gone.EVICTED)
                self._entries[response_id] = _Entry(stored, size, now)
                self._bytes += size
                return
        logger.info("response %s not stored: %d bytes, over the store's %d", response_id, size, self.max_bytes)

    def get(self, response_id: str, param: str = "response_id") -> StoredResponse:
        """The stored response, or `NotFound` naming `param` and saying why it is not here."""
        with self._lock:
            self._expire(self._clock())
            entry = self._entries.get(response_id)
            if entry is not None:
                return entry.stored
            reason = self._forgotten.get(response_id)
        raise NotFound(self._why(response_id, param, reason), param)

    def delete(self, response_id: str, param: str = "response_id") -> None:
        """Forget a stored response (`NotFound` as `get` when it is not here)."""
        with self._lock:
            self._expire(self._clock())
            if self._drop(response_id):
                self._forget(response_id, Gone.DELETED)
                return
            reason = self._forgotten.get(response_id)
        raise NotFound(self._why(response_id, param, reason), param)

    def __len__(self) -> int:
        with self._lock:
            self._expire(self._clock())
            return len(self._entries)

    @property
    def bytes_used(self) -> int:
        """The bytes the bound counts, of the entries kept now."""
        with self._lock:
            self._expire(self._clock())
            return self._bytes

    def stats(self) -> dict[str, int | float]:
        """For logs and metrics: what is kept now, and how many ids left, by reason."""
        with self._lock:
            self._expire(self._clock())
            counts = {reason.value: n for reason, n in self._counts.items()}
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "max_age_s": self.max_age_s,
                **counts,
                "forgotten_ids": len(self._forgotten),
            }

    # -- under the lock -------------------------------------------------------------------------
    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

    def _expire(self, now: float) -> None:
        """Drop the entries older than `max_age_s`: the first ones, as insertion order is age order."""
        while self._entries:
            oldest, entry = next(iter(self._entries.items()))
            if now - entry.stored_at <= self.max_age_s:
                return
            del self._entries[oldest]
            self._bytes -= entry.size
            self._forget(oldest, Gone.EXPIRED)

    def _forget(self, response_id: str, reason: Gone) -> None:
        self._counts[reason] += 1
        self._forgotten[response_id] = reason  # a new key (put drops a stored id's old reason): the newest
        while len(self._forgotten) > self._forgotten_cap:
            self._forgotten.popitem(last=False)

    def _why(self, response_id: str, param: str, reason: Gone | None) -> str:
        shown = printable(response_id[:_ID_SHOWN]) + ("..." if len(response_id) > _ID_SHOWN else "")
        head = f"{param} '{shown}'"
        if reason is Gone.EVICTED:
            return f"{head} was evicted: the store keeps {_size(self.max_bytes)} of responses per worker, newest first"
        if reason is Gone.EXPIRED:
            return f"{head} expired: the store keeps responses for {self.max_age_s:g} s"
        if reason is Gone.DELETED:
            return f"{head} was deleted"
        if reason is Gone.TOO_LARGE:
            return f"{head} was not stored because it was too large: over the whole store's {_size(self.max_bytes)}"
        return (
            f"{head} is unknown on this worker: responses are stored per worker; with several workers or "
            "instances, send the whole conversation with store: false, or route a conversation to one "
            "instance (SageMaker sticky sessions)"
        )


def _size(n: int) -> str:
    return f"{n / 2**20:.4g} MiB" if n >= 2**20 else f"{n} bytes"
