"""Why a TorchServe worker failed, from logs/model_log.log (the workers' own output).

TorchServe's ts_log.log only says "Worker died" or "Load model failed"; the traceback and
the handler's error lines are in model_log.log, one log4j line per line the worker printed:

    2026-12-01T11:30:00,123 [INFO ] W-9000-llama_1.0-stdout MODEL_LOG - Traceback (most recent call last):

`failure_cause` returns the last traceback (with the line logged before it, the handler's
own message), or else the last error lines, without the log4j prefixes.
"""

from __future__ import annotations

import re
from pathlib import Path

PREFIX = re.compile(r"^\S+ \[[A-Z]+\s*\] \S+ \S+ - ")
TRACEBACK = "Traceback (most recent call last):"
CHAIN = ("During handling of the above exception", "The above exception was the direct cause")
ERROR_WORDS = ("[ERROR]", "-stderr ", "Error", "Exception")
MAX_LINES = 60


def strip_prefix(line: str) -> str:
    return PREFIX.sub("", line, count=1)


def failure_cause(log: Path, offset: int = 0) -> str | None:
    """The last traceback or error lines logged after byte `offset`; None when there are none."""
    if not log.exists():
        return None
    with log.open("rb") as f:
        f.seek(offset)
        lines = f.read().decode("utf-8", errors="replace").splitlines()
    start = max((i for i, line in enumerate(lines) if TRACEBACK in line), default=None)
    if start is None:
        errors = [strip_prefix(line) for line in lines if any(word in line for word in ERROR_WORDS)]
        return "\n".join(errors[-10:]) or None
    block = [strip_prefix(lines[start - 1])] if start > 0 else []
    seen_frame = False
    for line in lines[start : start + MAX_LINES]:
        text = strip_prefix(line)
        block.append(text)
        if text.startswith(" "):
            seen_frame = True
        elif seen_frame and text.strip() and not text.startswith(CHAIN):
            break  # the exception line closes the traceback
    return "\n".join(block)
