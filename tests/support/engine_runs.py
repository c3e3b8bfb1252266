"""Driving a backend through a `StepEngine` in-process, to the end of every request, and watching what
each decode call gave each row (speculation's tests: how many tokens a row proposed and took)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from handler.engine.sequence import Sequence as EngineSequence
from handler.engine.step_engine import StepEngine
from handler.request import GenerationRequest


@dataclass(frozen=True)
class RowTaken:
    """One row of one decode call."""

    request_id: str
    slot: int
    max_tokens: int
    proposed: int
    taken: int


@contextmanager
def watching_decode_calls(backend: Any, engine: StepEngine) -> Iterator[list[list[RowTaken]]]:
    """A list that gets, per `decode_plan` call while the block runs, each row's `RowTaken`."""
    calls: list[list[RowTaken]] = []
    decode_plan = backend.decode_plan

    def watched(rows: Any) -> Any:
        names = {slot: sequence.request_id for slot, sequence in engine.scheduler.running()}
        answer = decode_plan(rows)
        calls.append(
            [
                RowTaken(names[row.slot], row.slot, row.max_tokens, len(row.proposal), len(got))
                for row, got in zip(rows, answer, strict=True)
            ]
        )
        return answer

    backend.decode_plan = watched
    try:
        yield calls
    finally:
        del backend.decode_plan


def run_to_end(
    backend: Any,
    requests: Sequence[GenerationRequest],
    steps: int = 500,
    engine: StepEngine | None = None,
    ids: Sequence[str] | None = None,
) -> list[EngineSequence]:
    """Every request through `engine` (default: a plain StepEngine on `backend`; more requests than
    slots wait for one), to its end; the finished Sequences, none failed. `ids`: the request ids
    (default r0, r1, ...)."""
    engine = engine or StepEngine(backend, prefill_token_budget=4096)
    ids = ids or [f"r{i}" for i in range(len(requests))]
    sequences = [
        EngineSequence(r, backend.encode(r.prompt), backend.tokenizer, backend.eos_token_ids, request_id)
        for r, request_id in zip(requests, ids, strict=True)
    ]
    for sequence in sequences:
        engine.submit(sequence)
    for _ in range(steps):
        if all(s.finished for s in sequences):
            break
        engine.step()
    assert all(s.finished and s.error is None for s in sequences), [s.error for s in sequences]
    return sequences
