"""A LoRA adapter loaded at run time on every serving replica (handler.lora.runtime_updates).

The worker sends each serving replica `LoadAdapter` and waits for every one's `AdapterLoaded`; a
replica that goes down meanwhile counts as answered (it restarts with the adapters its spec names,
which gain this one only if the load succeeded). If any replica refused, the adapter is unloaded from
those that took it, so the replicas never disagree on what a request may name.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path

from handler.lora.adapters import AdapterError


class PendingLoad:
    def __init__(self, name: str, path: Path, replicas: set[int]) -> None:
        self.name = name
        self.path = path
        self.future: Future[None] = Future()
        self.waiting = set(replicas)
        self.loaded: set[int] = set()
        self.errors: list[str] = []

    def answered(self, replica: int, error: str | None) -> bool:
        """A replica's answer; True when it was the last one awaited."""
        if replica in self.waiting:
            self.waiting.discard(replica)
            if error is None:
                self.loaded.add(replica)
            else:
                self.errors.append(error)
        return not self.waiting

    def gone(self, replica: int) -> bool:
        """The replica went down before it answered (or after it loaded); True when none is awaited now."""
        self.loaded.discard(replica)
        if replica not in self.waiting:
            return False
        self.waiting.discard(replica)
        return not self.waiting

    def settle(self) -> None:
        """Every replica answered: the future says how it went."""
        if self.errors:
            self.future.set_exception(AdapterError(self.errors[0]))
        elif not self.loaded:
            down = AdapterError(f"LoRA adapter {self.name!r}: every replica went down while loading it")
            self.future.set_exception(down)
        else:
            self.future.set_result(None)
