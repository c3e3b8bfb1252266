"""What goes on the wire for the native route: NDJSON chunks and JSON bodies.

Streaming: one JSON object per line; `text` fields concatenate to the completion; the
last line adds `finish_reason` and `usage`. A failure after the first line is reported
in-band as a last `{"error": ...}` line (the 200 status is already on the wire).
"""

from __future__ import annotations

import json
from typing import Any

from handler.errors import ServingError, to_http
from handler.sequence import Sequence

NDJSON = "application/x-ndjson"
JSON = "application/json"


def ndjson_line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def text_chunk(delta: str) -> str:
    return ndjson_line({"text": delta})


def usage(sequence: Sequence) -> dict[str, int]:
    return {"prompt_tokens": len(sequence.prompt_ids), "completion_tokens": sequence.completion_tokens}


def final_object(sequence: Sequence, text: str) -> dict[str, Any]:
    return {"text": text, "finish_reason": sequence.finish_reason.value, "usage": usage(sequence)}


def error_object(error: ServingError) -> dict[str, Any]:
    return to_http(error).body
