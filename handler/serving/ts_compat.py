"""What differs between the TorchServe releases the handler runs under (0.11 in every
SageMaker Neuron container, 0.12 elsewhere)."""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def _version() -> tuple[int, ...]:
    try:
        from ts.version import __version__
    except Exception:  # not inside TorchServe (unit tests): assume the newest
        return (99,)
    parts = []
    for part in __version__.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


TORCHSERVE_VERSION = _version()
# 0.12's worker leaves ts_stream_next unset when a stopping criterion returns None: one plain
# response that ends the request. 0.11 sends "true" for None (the stream would stay open).
ONE_SHOT_REPLIES = TORCHSERVE_VERSION >= (0, 12)
