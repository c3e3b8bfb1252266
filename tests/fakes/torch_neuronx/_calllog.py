"""Records calls as JSON lines in $FAKE_NEURONX_CALL_LOG (an invention of the fake, like the other
fakes' logs; every line carries "fake": "torch_neuronx"). Nothing is written at import: NxD Inference's
fake imports this package too, and its tests count their own lines."""

from __future__ import annotations

import json
import os
from typing import Any

ENV_VAR = "FAKE_NEURONX_CALL_LOG"


def record(call: str, **fields: Any) -> None:
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    line = json.dumps(
        {"call": call, "fake": "torch_neuronx", "pid": os.getpid(), **fields}, default=str, sort_keys=True
    )
    with open(path, "a", encoding="utf-8") as log:  # one write per line: safe across worker processes
        log.write(line + "\n")
