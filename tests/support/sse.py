"""Read OpenAI server-sent events back into JSON objects."""

from __future__ import annotations

import json
from typing import Any

from tests.support.torchserve_harness import Reply

DONE = "[DONE]"


def events(raw: str) -> list[Any]:
    """`data: ...` payloads in order; `[DONE]` stays a string. Every event must end in a blank line."""
    assert raw.endswith("\n\n"), raw[-80:]
    out: list[Any] = []
    for block in raw.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: ") :]
        out.append(payload if payload == DONE else json.loads(payload))
    return out


def reply_events(reply: Reply) -> list[Any]:
    return events("".join(reply.chunks) + reply.final)
