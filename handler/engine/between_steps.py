"""Changes to what the backend serves, made between two steps on the stepping thread (a backend is
called from one thread at a time): LoRA adapters loaded and unloaded at run time
(handler.lora.runtime_updates).

A load runs before the next step's plan, so the step after it may admit rows naming the adapter; its
caller holds a `Future` for the outcome. An unload waits for the adapter's last sequence, waiting or
running: the names a request may use have already lost it (handler/core/adapter_updates.py), so
no new one comes, and the backend forgets it at the first step that finds none left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future

logger = logging.getLogger(__name__)


class BetweenSteps:
    """What waits for the gap before the next step. Not locked: its owner's lock guards it."""

    def __init__(self) -> None:
        self._jobs: list[tuple[Callable[[], None], Future[None]]] = []
        self.unloading: set[str] = set()  # adapters to forget once no sequence names them

    def __bool__(self) -> bool:
        return bool(self._jobs or self.unloading)

    def add(self, job: Callable[[], None]) -> Future[None]:
        future: Future[None] = Future()
        self._jobs.append((job, future))
        return future

    def take(self, in_use: Callable[[str], bool]) -> tuple[list[str], list[tuple[Callable[[], None], Future[None]]]]:
        """The unloads due now (adapters no sequence names) and every queued job, removed from here."""
        due = sorted(name for name in self.unloading if not in_use(name))
        self.unloading.difference_update(due)
        jobs, self._jobs = self._jobs, []
        return due, jobs


def failed(exc: BaseException) -> Future[None]:
    """A future that already failed with `exc`."""
    future: Future[None] = Future()
    future.set_exception(exc)
    return future


def run_jobs(jobs: list[tuple[Callable[[], None], Future[None]]]) -> None:
    """Each job, its outcome (or what it raised) into its future."""
    for job, future in jobs:
        if not future.set_running_or_notify_cancel():
            continue
        try:
            job()
        except BaseException as exc:  # the caller's to report: the engine goes on serving
            future.set_exception(exc)
        else:
            future.set_result(None)


def run_unloads(names: list[str], unload: Callable[[str], None]) -> None:
    for name in names:
        try:
            unload(name)
        except Exception:
            logger.exception("unloading LoRA adapter %r failed", name)
