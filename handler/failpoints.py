"""Fault injection for end-to-end tests: off unless INF2_FAILPOINT_PROMPT is set.

With INF2_FAILPOINT_PROMPT=<marker>, a decode step holding a sequence whose prompt
contains the marker and which has generated FAIL_AFTER_TOKENS tokens fails, exactly
where a real device or model error would surface (the backend call). Nothing else changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

ENV_VAR = "INF2_FAILPOINT_PROMPT"
FAIL_AFTER_TOKENS = 8


class InjectedFailure(RuntimeError):
    pass


def check_decode(prompts_and_counts: Iterable[tuple[str, int]]) -> None:
    """Raise InjectedFailure when a sequence in this decode step matches the failpoint."""
    marker = os.environ.get(ENV_VAR)
    if not marker:
        return
    for prompt, generated in prompts_and_counts:
        if marker in prompt and generated >= FAIL_AFTER_TOKENS:
            raise InjectedFailure(f"{ENV_VAR}: injected failure in a decode step")
