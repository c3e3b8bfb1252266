"""A test hook, not in the real SDK (like the call log): hold generation at one decode step
while a file exists, so a test can see what a client received before generation could end.

`FAKE_NEURONX_HOLD_FILE`: the file; `FAKE_NEURONX_HOLD_AT_STEP` (default 8): the decode step
that waits, counted per sequence slot from that slot's context encoding (a decode call holds
when any slot in it reaches that step); `FAKE_NEURONX_HOLD_MAX_S` (default 20): the longest
wait, so a test that never removes the file cannot wedge a server. Each wait is recorded in
the call log as `hold` (when it starts) and `release` (with `timed_out`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

from transformers_neuronx import _calllog


def maybe_hold(decode_steps: Iterable[int]) -> None:
    """Wait while the hold file exists, if one of the slots in this decode call is at the held step."""
    path = os.environ.get("FAKE_NEURONX_HOLD_FILE")
    step = int(os.environ.get("FAKE_NEURONX_HOLD_AT_STEP", "8"))
    if not path or step not in set(decode_steps) or not os.path.exists(path):
        return
    _calllog.record("hold", step=step)
    deadline = time.monotonic() + float(os.environ.get("FAKE_NEURONX_HOLD_MAX_S", "20"))
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    _calllog.record("release", step=step, timed_out=os.path.exists(path))
