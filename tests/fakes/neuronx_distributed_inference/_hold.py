"""A test hook, not in the real SDK (like the call log): hold generation at one decode step
while a file exists, so a test can see what a client received before generation could end.
Same variables as the transformers-neuronx fake's hook:

`FAKE_NEURONX_HOLD_FILE`: the file; `FAKE_NEURONX_HOLD_AT_STEP` (default 8): the decode step
that waits, counted per sequence slot (seq_id) from that slot's context encoding (a decode
call holds when any slot the caller passed reaches that step); `FAKE_NEURONX_HOLD_MAX_S`
(default 20): the longest wait. Each wait is logged as `hold` and `release` (`timed_out`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from neuronx_distributed_inference import _calllog


def maybe_hold(decode_steps: Iterable[int]) -> None:
    path = os.environ.get("FAKE_NEURONX_HOLD_FILE")
    step = int(os.environ.get("FAKE_NEURONX_HOLD_AT_STEP", "8"))
    if not path or step not in set(decode_steps) or not os.path.exists(path):
        return
    _calllog.record("hold", step=step)
    deadline = time.monotonic() + float(os.environ.get("FAKE_NEURONX_HOLD_MAX_S", "20"))
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    _calllog.record("release", step=step, timed_out=os.path.exists(path))
