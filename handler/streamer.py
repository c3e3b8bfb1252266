"""A batch token streamer: `generate` puts each step's tokens, the engine iterates them.

It plays the role of TorchServe's `TextIteratorStreamerBatch` in the seed handler, but
hands over token ids instead of text: the engine needs the ids to count tokens, spot
EOS, and detokenize incrementally (see detokenizer.py), and one queue for the whole
batch keeps the rows in lockstep by construction.
"""

from __future__ import annotations

import queue
from typing import Any

from transformers.generation.streamers import BaseStreamer

from handler.errors import EngineError

_END = object()


class TokenStreamer(BaseStreamer):
    def __init__(self, timeout_s: float) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._timeout_s = timeout_s
        self._saw_prompt = False

    def put(self, value: Any) -> None:
        """Called by `generate`: first with the prompt ids [B, T] (skipped), then [B] per step."""
        if not self._saw_prompt:
            self._saw_prompt = True
            return
        self._queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        """Called when generation ends, normally or not; idempotent for the consumer."""
        self._queue.put(_END)

    def __iter__(self) -> TokenStreamer:
        return self

    def __next__(self) -> list[int]:
        try:
            item = self._queue.get(timeout=self._timeout_s)
        except queue.Empty:
            raise EngineError(f"no token was generated within {self._timeout_s:.0f} s") from None
        if item is _END:
            self._queue.put(_END)  # later readers stop too
            raise StopIteration
        return item
