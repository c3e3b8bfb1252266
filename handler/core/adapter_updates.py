"""LoRA adapters loaded and unloaded while serving (`handler.lora.runtime_updates`, vLLM's
`/v1/load_lora_adapter` and `/v1/unload_lora_adapter`), for both frontends.

The names a request may use (`GenerationCore.limits.adapters`) and what the engine serves change
together, one change at a time:
- load: the adapter is checked and loaded between two steps, on every replica
  (handler/engine/between_steps.py), and only then can a request name it: the call returns when it
  is served. The wait is bounded by `handler.step_timeout_s`; a load still running then is named
  once it finishes.
- unload: new requests stop naming it at once (404 / 400 as for any unknown adapter); the
  requests already running with it finish, and the backend forgets it after the last one.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from handler.engine.interface import Engine
from handler.errors import InvalidRequest, NotFound, ServiceUnavailable
from handler.lora.adapters import AdapterError
from handler.request import AdapterChange, Limits

logger = logging.getLogger(__name__)


class LimitsHolder(Protocol):
    """Where requests read the names they may use (the core both frontends share)."""

    limits: Limits


class AdapterUpdates:
    def __init__(
        self,
        names: LimitsHolder,
        engine: Engine,
        refusal: Callable[[bool], str | None],
        max_rank: int,
        model_dir: str | Path | None,
        timeout_s: float,
    ) -> None:
        """`refusal(unload)`: why the backend cannot make the change while serving (None: it can);
        `max_rank`: handler.lora.max_lora_rank."""
        self.names = names
        self.engine = engine
        self.refusal = refusal
        self.max_rank = max_rank
        self.model_dir = Path(model_dir or ".")
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # one change at a time

    def apply(self, change: AdapterChange) -> None:
        """Apply the change, or raise the ServingError that answers the request (naming its field)."""
        refusal = self.refusal(change.path is None)
        if refusal is not None:
            raise InvalidRequest(refusal, "lora_name" if change.path is None else "lora_path")
        with self._lock:
            if change.path is None:
                self._unload(change.name)
            else:
                self._load(change.name, change.path)

    def _load(self, name: str, given: str) -> None:
        if name in self.names.limits.adapters:
            raise InvalidRequest(f"the LoRA adapter '{name}' is already loaded", "lora_name")
        path = Path(given) if Path(given).is_absolute() else self.model_dir / given  # as handler.lora.adapters
        loading = self.engine.load_adapter(name, path.resolve(), self.max_rank)
        loading.add_done_callback(lambda done: self._loaded(name, path, done))
        try:
            loading.result(self.timeout_s)
        except AdapterError as exc:
            raise InvalidRequest(str(exc), "lora_path") from None
        except concurrent.futures.TimeoutError:
            raise ServiceUnavailable(
                f"LoRA adapter '{name}' is still loading after {self.timeout_s:.0f} s (handler.step_timeout_s); "
                "GET /v1/models lists it once it is served"
            ) from None

    def _loaded(self, name: str, path: Path, done: Future[None]) -> None:
        """A load finished (on the stepping thread, or a replica's reader): name it, if it loaded."""
        if done.exception() is not None:
            logger.info("LoRA adapter %r not loaded: %s", name, done.exception())
            return
        self._set_names(self.names.limits.adapters | {name})
        logger.info("LoRA adapter %r loaded at run time from %s", name, path)

    def _unload(self, name: str) -> None:
        if name not in self.names.limits.adapters:
            raise NotFound(f"the LoRA adapter '{name}' is not loaded", "lora_name")
        self._set_names(self.names.limits.adapters - {name})
        self.engine.unload_adapter(name)
        logger.info("LoRA adapter %r unloaded: new requests cannot name it; it goes after its last request", name)

    def _set_names(self, names: frozenset[str]) -> None:
        """What requests may name from now on (one attribute swap: a request reads one or the other)."""
        self.names.limits = dataclasses.replace(self.names.limits, adapters=frozenset(names))
