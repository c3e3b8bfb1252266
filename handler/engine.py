"""Runs one micro-batch: generation in a worker thread, tokens to text in the caller's.

No TorchServe and no HTTP here: `on_text(sequence, delta)` is how text leaves.
Whatever happens inside the backend, the streamer is ended, every sequence ends
finished or failed, and the caller's thread returns.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from collections.abc import Sequence as Seq

from handler import failpoints
from handler.backends.base import Backend
from handler.errors import EngineError
from handler.sequence import Sequence
from handler.streamer import TokenStreamer

logger = logging.getLogger(__name__)

TextCallback = Callable[[Sequence, str], None]
FinishCallback = Callable[[Sequence], None]


class MicroBatchEngine:
    def __init__(self, backend: Backend, step_timeout_s: float) -> None:
        self.backend = backend
        self.step_timeout_s = step_timeout_s

    def run(self, sequences: Seq[Sequence], on_text: TextCallback, on_finished: FinishCallback | None = None) -> None:
        """Generate the micro-batch. `on_text` gets each sequence's text as it is decoded;
        `on_finished` is called the moment a sequence finishes (EOS, stop, length), while
        its batch-mates may still be generating."""
        if not sequences:
            return
        streamer = TokenStreamer(self.step_timeout_s)
        backend_streamer = failpoints.wrap_streamer(streamer, [s.request.prompt for s in sequences])
        failure: list[BaseException] = []

        def generate() -> None:
            try:
                self.backend.generate([s.row for s in sequences], backend_streamer, lambda i: sequences[i].finished)
            except BaseException as exc:
                failure.append(exc)
            finally:
                streamer.end()

        worker = threading.Thread(target=generate, name="generate", daemon=True)
        worker.start()
        try:
            for step in streamer:
                for sequence, token_id in zip(sequences, step, strict=False):
                    if not sequence.finished:
                        delta = sequence.append(token_id)
                        if delta:
                            on_text(sequence, delta)
                        if sequence.finished and on_finished:
                            on_finished(sequence)
        except EngineError as exc:
            failure.append(exc)
        worker.join(timeout=self.step_timeout_s)
        if failure:
            logger.error("generation failed for a micro-batch of %d", len(sequences), exc_info=failure[0])
            error = (
                failure[0] if isinstance(failure[0], EngineError) else EngineError(f"generation failed: {failure[0]}")
            )
            for sequence in sequences:
                sequence.fail(error)
            return
        for sequence in sequences:
            if sequence.finished:
                continue
            delta = sequence.end()
            if delta:
                on_text(sequence, delta)
            if on_finished:
                on_finished(sequence)
