"""The ASGI frontend's hand-over to the engine (handler/frontend/bridge.py): a request's sequences go
to the engine when it arrives, and then the engine hears that its admissions are done, so a step it
holds for a likely newcomer (scheduler.admission_wait: a closed-loop client's next request) starts
at once instead of at the hold's deadline."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from handler.frontend.bridge import EngineBridge


class RecordingEngine:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def submit(self, sequence: SimpleNamespace) -> None:
        self.calls.append(("submit", sequence.request_id))

    def admissions_done(self) -> None:
        self.calls.append(("admissions_done",))


def test_a_submit_releases_a_step_held_for_it():
    engine = RecordingEngine()
    loop = asyncio.new_event_loop()
    try:
        bridge = EngineBridge(engine, loop)  # type: ignore[arg-type]
        bridge.submit([SimpleNamespace(request_id="r-0"), SimpleNamespace(request_id="r-1")])  # type: ignore[list-item]
    finally:
        loop.close()
    assert engine.calls == [("submit", "r-0"), ("submit", "r-1"), ("admissions_done",)]
    assert bridge.in_flight == 2
