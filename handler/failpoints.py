"""Fault injection for end-to-end tests: off unless INF2_FAILPOINT_PROMPT is set.

With INF2_FAILPOINT_PROMPT=<marker>, a micro-batch holding a prompt that contains
the marker fails inside the backend's `generate` after a few streamed steps, exactly
where a real device or model error would surface. Nothing else changes.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

ENV_VAR = "INF2_FAILPOINT_PROMPT"
FAIL_AFTER_STEPS = 8


class InjectedFailure(RuntimeError):
    pass


class _FailingStreamer:
    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._puts = 0

    def put(self, value: Any) -> None:
        self._puts += 1
        if self._puts > FAIL_AFTER_STEPS:  # the first put is the prompt
            raise InjectedFailure(f"{ENV_VAR}: injected failure inside generate")
        self._inner.put(value)

    def end(self) -> None:
        self._inner.end()


def wrap_streamer(streamer: Any, prompts: Sequence[str]) -> Any:
    marker = os.environ.get(ENV_VAR)
    if marker and any(marker in prompt for prompt in prompts):
        return _FailingStreamer(streamer)
    return streamer
