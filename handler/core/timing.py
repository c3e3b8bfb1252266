"""When a request arrived (the `X-Request-Start` header a client or proxy may set) and the
figures of a finished sequence (TTFT, mean ITL, tokens), for either frontend's metrics."""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from handler.engine.sequence import Sequence

REQUEST_START_HEADERS = ("X-Request-Start", "x-request-start")


@dataclass(frozen=True)
class RequestFigures:
    ttft_s: float
    itl_s: float | None
    generated_tokens: int


def request_figures(sequence: Sequence) -> RequestFigures | None:
    """TTFT, mean ITL and token count of a finished sequence; None if it made no token."""
    if sequence.first_token_at is None or sequence.completion_tokens == 0:
        return None
    ttft = sequence.first_token_at - sequence.received_at
    itl = None
    if sequence.completion_tokens > 1 and sequence.last_token_at is not None:
        itl = (sequence.last_token_at - sequence.first_token_at) / (sequence.completion_tokens - 1)
    return RequestFigures(ttft, itl, sequence.completion_tokens)


def parse_request_start(value: str | None, now_wall: float | None = None) -> float | None:
    """`X-Request-Start` as unix seconds; None when absent, malformed or implausible."""
    if not value:
        return None
    text = value.strip()
    text = text[2:] if text.startswith("t=") else text
    try:
        stamp = float(text)
    except ValueError:
        return None
    for scale in (1.0, 1e3, 1e6):  # seconds, milliseconds, microseconds
        seconds = stamp / scale
        if seconds < 1e10:
            break
    now_wall = time.time() if now_wall is None else now_wall
    if not now_wall - 3600 <= seconds <= now_wall + 1:  # another clock or a stale stamp: ignore
        return None
    return seconds


def arrival_from_headers(headers: Mapping[str, str], now: float | None = None) -> float:
    """When a request arrived, on the `time.perf_counter()` clock: `X-Request-Start` when it is
    set and plausible, else now."""
    now = time.perf_counter() if now is None else now
    for header in REQUEST_START_HEADERS:
        wall = parse_request_start(headers.get(header))
        if wall is not None:
            return now - max(0.0, time.time() - wall)
    return now
