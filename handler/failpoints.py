"""Fault injection for end-to-end tests: each is off unless its variable is set.

INF2_FAILPOINT_PROMPT=<marker>: a decode step holding a sequence whose prompt contains the
marker and which has generated FAIL_AFTER_TOKENS tokens fails, exactly where a real device
or model error would surface (the backend call). Nothing else changes.
INF2_FAILPOINT_HANG=<marker>:<seconds>: the first decode step holding a sequence whose prompt
contains the marker sleeps that long, once per process (a hung device call, for the step
watchdog, `handler.step_timeout_s`).
INF2_FAILPOINT_WARMUP_S=<seconds>: the warm-up at model load takes that much longer (a slow
start on the sim backend, for readiness tests).
INF2_FAILPOINT_INIT=<message>: loading the model fails with that message (a worker that
cannot start).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable

ENV_VAR = "INF2_FAILPOINT_PROMPT"
FAIL_AFTER_TOKENS = 8
WARMUP_ENV = "INF2_FAILPOINT_WARMUP_S"
INIT_ENV = "INF2_FAILPOINT_INIT"
HANG_ENV = "INF2_FAILPOINT_HANG"

logger = logging.getLogger(__name__)


class InjectedFailure(RuntimeError):
    pass


_hung = False  # INF2_FAILPOINT_HANG slept already (it hangs once per process)


def check_decode(prompts_and_counts: Iterable[tuple[str, int]]) -> None:
    """Raise InjectedFailure when a sequence in this decode step matches the failpoint; sleep
    when one matches the hang failpoint for the first time."""
    rows = list(prompts_and_counts)
    _maybe_hang(prompt for prompt, _ in rows)
    marker = os.environ.get(ENV_VAR)
    if not marker:
        return
    for prompt, generated in rows:
        if marker in prompt and generated >= FAIL_AFTER_TOKENS:
            raise InjectedFailure(f"{ENV_VAR}: injected failure in a decode step")


def _maybe_hang(prompts: Iterable[str]) -> None:
    global _hung
    setting = os.environ.get(HANG_ENV)
    if not setting or _hung:
        return
    marker, _, seconds = setting.rpartition(":")
    if marker and any(marker in prompt for prompt in prompts):
        _hung = True
        logger.warning("%s: a decode step hangs for %s s", HANG_ENV, seconds)
        time.sleep(float(seconds))
        logger.warning("%s: the hung step goes on", HANG_ENV)


def check_init() -> None:
    """Raise InjectedFailure (with INF2_FAILPOINT_INIT's text) when that failpoint is set."""
    message = os.environ.get(INIT_ENV)
    if message:
        raise InjectedFailure(message)


def delay_warmup() -> None:
    """Sleep INF2_FAILPOINT_WARMUP_S seconds, when set: a warm-up that takes that much longer."""
    seconds = float(os.environ.get(WARMUP_ENV) or 0)
    if seconds > 0:
        logger.info("%s: the warm-up takes %.1f s longer", WARMUP_ENV, seconds)
        time.sleep(seconds)
