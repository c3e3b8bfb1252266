"""A test hook, not in the real SDK (like the call log): hold generation at one decode step
while a file exists, so a test can see what a client received before generation could end.

`FAKE_NEURONX_HOLD_FILE`: the file; `FAKE_NEURONX_HOLD_AT_STEP` (default 8): the decode step
(counted from each context encoding) that waits; `FAKE_NEURONX_HOLD_MAX_S` (default 20): the
longest wait, so a test that never removes the file cannot wedge a server. Each wait is
recorded in the call log as `hold` (when it starts) and `release` (with `timed_out`).
"""

from __future__ import annotations

import os
import time

from transformers_neuronx import _calllog


def maybe_hold(decode_step: int) -> None:
    path = os.environ.get("FAKE_NEURONX_HOLD_FILE")
    if not path or decode_step != int(os.environ.get("FAKE_NEURONX_HOLD_AT_STEP", "8")) or not os.path.exists(path):
        return
    _calllog.record("hold", step=decode_step)
    deadline = time.monotonic() + float(os.environ.get("FAKE_NEURONX_HOLD_MAX_S", "20"))
    while os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    _calllog.record("release", step=decode_step, timed_out=os.path.exists(path))
