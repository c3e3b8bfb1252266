"""Records calls as JSON lines in $FAKE_NEURONX_CALL_LOG (the fake's only invention)."""

from __future__ import annotations

import json
import os
from typing import Any

ENV_VAR = "FAKE_NEURONX_CALL_LOG"


def record(call: str, **fields: Any) -> None:
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    line = json.dumps({"call": call, "pid": os.getpid(), **fields}, default=str, sort_keys=True)
    with open(path, "a", encoding="utf-8") as log:  # one write per line: safe across worker processes
        log.write(line + "\n")


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line; a log that was never written raises FileNotFoundError (an empty
    answer would let `assert not calls(...)` pass without the fake ever running)."""
    with open(path, encoding="utf-8") as log:
        text = log.read()
    lines = text.split("\n")[:-1]  # a line still being written has no newline yet
    return [json.loads(line) for line in lines if line.strip()]
