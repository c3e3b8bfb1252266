"""What the serving layer calls on an engine: the one `StepEngine` of a worker, or the
`ReplicaSet` that drives R of them in replica processes (handler/replicas/). Both satisfy it;
`serving/continuous.py` knows only this."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol

from handler.engine.outbox import Update
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepRecord
from handler.errors import ServingError


class Engine(Protocol):
    steps: int  # steps run so far; `wait` wakes after the next one
    on_idle: Callable[[], None] | None  # called from the stepping thread when a step left it idle

    @property
    def slots(self) -> int:
        """Sequences it can generate at once now (a replica that is down holds none)."""
        ...

    @property
    def free_slots(self) -> int:
        """Slots a newcomer would find at the next step (what the waiting sequences take is not free)."""
        ...

    @property
    def occupied(self) -> int: ...

    @property
    def waiting(self) -> int: ...

    def submit(self, sequence: Sequence) -> None: ...

    def abort(self, request_id: str) -> None: ...

    def admissions_done(self) -> None: ...

    def load_adapter(self, name: str, path: Path, max_rank: int) -> Future[None]:
        """Check and load a LoRA adapter between steps (on every replica); the future says how it went."""
        ...

    def unload_adapter(self, name: str) -> None:
        """Forget a LoRA adapter once no sequence names it (on every replica)."""
        ...

    def fail_all(self, error: ServingError) -> None: ...

    def take(self, request_ids: Iterable[str]) -> dict[str, Update]: ...

    def wait(self, request_ids: Iterable[str], after_step: int, timeout_s: float) -> None: ...

    def take_records(self) -> list[StepRecord]: ...

    def step_running_for(self) -> float: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
