"""The native route, `POST /predictions/<model>`: NDJSON streaming or one JSON body.

Streaming: one JSON object per line; `text` fields concatenate to the completion; the
last line adds `finish_reason` and `usage`. A failure after the first line is reported
in-band as a last `{"error": ...}` line (the 200 status is already on the wire).
"""

from __future__ import annotations

import json
from typing import Any

from handler.api.base import Api
from handler.errors import ServingError, to_http
from handler.protocol import parse_request
from handler.request import GenerationRequest, Limits
from handler.sequence import Sequence

NDJSON = "application/x-ndjson"
JSON = "application/json"


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def usage(sequence: Sequence) -> dict[str, int]:
    return {"prompt_tokens": len(sequence.prompt_ids), "completion_tokens": sequence.completion_tokens}


class NativeApi(Api):
    name = "native"

    def parse(self, body: Any, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        return parse_request(body, limits)

    def content_type(self, request: GenerationRequest) -> str:
        return NDJSON if request.stream else JSON

    def chunk(self, sequence: Sequence, delta: str) -> str:
        return _line({"text": delta})

    def final(self, sequence: Sequence) -> str:
        streaming = sequence.request.stream
        text = "" if streaming else sequence.full_text
        body = {"text": text, "finish_reason": sequence.finish_reason.value, "usage": usage(sequence)}
        return _line(body) if streaming else json.dumps(body, ensure_ascii=False)

    def error(self, error: ServingError, midstream: bool) -> str:
        body = json.dumps(to_http(error).body, ensure_ascii=False)
        return body + "\n" if midstream else body
