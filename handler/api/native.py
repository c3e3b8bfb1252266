"""The native route, `POST /predictions/<model>`: NDJSON streaming or one JSON body.

Streaming: one JSON object per line; `text` fields concatenate to the completion; the
last line adds `finish_reason` and `usage`. A failure after the first line is reported
in-band as a last `{"error": ...}` line (the 200 status is already on the wire).
"""

from __future__ import annotations

import json
from typing import Any

from handler.api.base import Api
from handler.api.common import parse_request
from handler.api.logprobs import native_token, take_tokens, text_sent
from handler.engine.sequence import Sequence
from handler.errors import ServingError, to_http
from handler.request import GenerationRequest, Limits

NDJSON = "application/x-ndjson"
JSON = "application/json"


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def usage(sequence: Sequence) -> dict[str, int]:
    return {"prompt_tokens": len(sequence.prompt_ids), "completion_tokens": sequence.completion_tokens}


def _add_logprobs(body: dict[str, Any], sequence: Sequence, sent: int | None) -> None:
    """`prompt_tokens` (once, with the first line) and `tokens` (those whose text this line
    completes; the last line has the rest, EOS included), when the request asked for them."""
    request = sequence.request
    if request.logprobs is None and not request.prompt_logprobs:
        return
    tokens = take_tokens(sequence, text_sent=sent, with_prompt=request.prompt_logprobs)
    prompt = [native_token(t) for t in tokens if t.prompt]
    if prompt:
        body["prompt_tokens"] = prompt
    if request.logprobs is not None:
        body["tokens"] = [native_token(t) for t in tokens if not t.prompt]


class NativeApi(Api):
    name = "native"

    def parse(self, body: Any, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        return parse_request(body, limits)

    def content_type(self, request: GenerationRequest) -> str:
        return NDJSON if request.stream else JSON

    def chunk(self, sequence: Sequence, delta: str) -> str:
        body: dict[str, Any] = {"text": delta}
        _add_logprobs(body, sequence, text_sent(sequence, delta))
        return _line(body)

    def final(self, sequence: Sequence) -> str:
        streaming = sequence.request.stream
        text = "" if streaming else sequence.full_text
        body: dict[str, Any] = {"text": text}
        _add_logprobs(body, sequence, None)
        body.update(finish_reason=sequence.finish_reason.value, usage=usage(sequence))
        return _line(body) if streaming else json.dumps(body, ensure_ascii=False)

    def error(self, error: ServingError, midstream: bool) -> str:
        body = json.dumps(to_http(error).body, ensure_ascii=False)
        return body + "\n" if midstream else body
