"""Records calls as JSON lines in $FAKE_NEURONX_CALL_LOG (an invention of the fake, like the
transformers-neuronx fake's log; every line carries "fake": "nxdi")."""

from __future__ import annotations

import json
import os
from typing import Any

ENV_VAR = "FAKE_NEURONX_CALL_LOG"


def record(call: str, **fields: Any) -> None:
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    line = json.dumps({"call": call, "fake": "nxdi", "pid": os.getpid(), **fields}, default=str, sort_keys=True)
    with open(path, "a", encoding="utf-8") as log:  # one write per line: safe across worker processes
        log.write(line + "\n")


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every complete line; a log that was never written raises FileNotFoundError."""
    with open(path, encoding="utf-8") as log:
        text = log.read()
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]
