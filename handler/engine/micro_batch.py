"""The static mode's engine: one micro-batch is prefilled together and decoded until
every sequence in it ended; nobody joins in between (the seed's design, kept as the
baseline). It drives the same step-level backends as the continuous engine.

No TorchServe and no HTTP here: `on_text(sequence, delta)` is how text leaves, and
`on_finished(sequence)` is called the moment a sequence ends while its batch-mates may
still be generating. Whatever a backend raises, every sequence ends finished or failed.
`interrupt()`, asked before each step, may end the micro-batch early: it returns the error
the unfinished sequences fail with (the drain deadline passed).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq

from handler import failpoints
from handler.backends.base import Backend
from handler.engine.sequence import Sequence
from handler.errors import EngineError, ServingError
from handler.request import TokenChoice

logger = logging.getLogger(__name__)

TextCallback = Callable[[Sequence, str], None]
FinishCallback = Callable[[Sequence], None]
Interrupt = Callable[[], ServingError | None]


class MicroBatchEngine:
    def __init__(self, backend: Backend, interrupt: Interrupt | None = None) -> None:
        self.backend = backend
        self._interrupt = interrupt or (lambda: None)
        # One micro-batch on the model at a time: the backend's slots and (on Neuron) its
        # decode kernel are shared; micro-batches from several inference threads take turns.
        self._model_lock = threading.Lock()

    def run(self, sequences: Seq[Sequence], on_text: TextCallback, on_finished: FinishCallback | None = None) -> None:
        """Generate the micro-batch (at most `backend.n_slots` sequences)."""
        if not sequences:
            return
        if len(sequences) > self.backend.n_slots:
            raise ValueError(f"{len(sequences)} sequences exceed the backend's {self.backend.n_slots} slots")
        with self._model_lock:
            self._run(list(sequences), on_text, on_finished or (lambda _s: None))

    def _run(self, sequences: list[Sequence], on_text: TextCallback, on_finished: FinishCallback) -> None:
        live = list(enumerate(sequences))  # slot i holds sequence i
        try:
            if self._interrupted(live):
                return
            choices = self.backend.prefill([s.slot_request(slot) for slot, s in live])
            live = self._deliver(live, choices, on_text, on_finished)
            while live and not self._interrupted(live):
                failpoints.check_decode((s.request.prompt, s.completion_tokens) for _, s in live)
                choices = self.backend.decode([slot for slot, _ in live])
                live = self._deliver(live, choices, on_text, on_finished)
        except Exception as exc:
            logger.error("generation failed for a micro-batch of %d", len(sequences), exc_info=exc)
            error = exc if isinstance(exc, EngineError) else EngineError(f"generation failed: {exc}")
            for sequence in sequences:
                sequence.fail(error)
        finally:
            for slot, _ in live:
                self._release(slot)

    def _interrupted(self, live: list[tuple[int, Sequence]]) -> bool:
        error = self._interrupt()
        if error is None:
            return False
        logger.info("%d sequence(s) ended: %s", len(live), error.message)
        for _, sequence in live:
            sequence.fail(error)
        return True

    def _deliver(
        self,
        live: list[tuple[int, Sequence]],
        choices: list[TokenChoice],
        on_text: TextCallback,
        on_finished: FinishCallback,
    ) -> list[tuple[int, Sequence]]:
        still = []
        for (slot, sequence), choice in zip(live, choices, strict=True):
            delta = sequence.take(choice)
            if delta:
                on_text(sequence, delta)
            if sequence.finished:
                on_finished(sequence)
                self._release(slot)
            else:
                still.append((slot, sequence))
        return still

    def _release(self, slot: int) -> None:
        try:
            self.backend.release(slot)
        except Exception:
            logger.exception("releasing slot %d failed", slot)
