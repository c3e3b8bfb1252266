"""scripts/sagemaker_stream.py: lines reassembled from event payloads split anywhere,
multi-byte UTF-8 characters included, and the invoke call's parameters."""

from __future__ import annotations

import io
import itertools
import json
import random
from typing import Any

import pytest

from scripts.sagemaker_stream import LineAssembler, StreamError, request_body, sagemaker_payloads, stream_text

TEXTS = ["Today ", "天气", "真好", " 🌞🏖️", ", café", "\n", "naïve ", "😀"]
FINAL = {"text": "", "finish_reason": "length", "usage": {"prompt_tokens": 5, "completion_tokens": 8}}


def ndjson() -> bytes:
    lines = [{"text": t} for t in TEXTS] + [FINAL]
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def events(parts: list[bytes]) -> list[dict[str, Any]]:
    return [{"PayloadPart": {"Bytes": part}} for part in parts]


def test_every_single_split_point_gives_the_same_lines():
    data = ndjson()
    expected = data.decode("utf-8").splitlines()
    multibyte_cuts = 0
    for cut in range(1, len(data)):
        if data[cut] & 0xC0 == 0x80:  # the cut falls inside a multi-byte UTF-8 character
            multibyte_cuts += 1
        assembler = LineAssembler()
        lines = assembler.feed(data[:cut]) + assembler.feed(data[cut:]) + assembler.flush()
        assert lines == expected, cut
    assert multibyte_cuts > 20


def test_byte_by_byte_and_random_payloads_print_the_same_text():
    data = ndjson()
    rng = random.Random(0)
    splits = [list(range(1, len(data)))]  # one byte per payload
    splits += [rng.sample(range(1, len(data)), k) for k in (1, 3, 17, 60) for _ in range(5)]
    for cuts in splits:
        out = io.StringIO()
        last = stream_text(split_at(data, cuts), out)
        assert out.getvalue() == "".join(TEXTS)
        assert last == FINAL


def test_a_last_line_without_newline_is_not_lost():
    out = io.StringIO()
    last = stream_text([b'{"text": "a"}\n{"text": "b", "finish_', b'reason": "eos"}'], out)
    assert out.getvalue() == "ab" and last["finish_reason"] == "eos"


def test_sse_lines_are_read_too():
    sse = (
        'data: {"choices": [{"text": "hé"}]}\n\ndata: {"choices": [{"delta": {"content": "llo"}}]}\n\ndata: [DONE]\n\n'
    )
    data = sse.encode("utf-8")
    out = io.StringIO()
    stream_text(split_at(data, [21, 22, 40]), out)
    assert out.getvalue() == "héllo"


def test_in_band_error_line_raises_after_the_text_so_far():
    out = io.StringIO()
    data = b'{"text": "partial"}\n{"error": {"message": "generation failed", "type": "server_error"}}\n'
    with pytest.raises(StreamError, match="generation failed"):
        stream_text(split_at(data, [5, 30]), out)
    assert out.getvalue() == "partial"


class FakeRuntime:
    """A sagemaker-runtime client: records the call, answers with an event stream."""

    def __init__(self, stream: list[dict[str, Any]]) -> None:
        self.stream = stream
        self.calls: list[dict[str, Any]] = []

    def invoke_endpoint_with_response_stream(self, **params: Any) -> dict[str, Any]:
        self.calls.append(params)
        return {"Body": iter(self.stream), "ContentType": "application/x-ndjson"}


def test_invoke_parameters_and_payloads():
    data = ndjson()
    runtime = FakeRuntime(events(split_at(data, [3, 50, 51, 52, 200])))
    body, content_type = request_body("Today the weather is", 64, plain=False)
    out = io.StringIO()
    last = stream_text(sagemaker_payloads(runtime, "ep-1", body, content_type), out)
    assert out.getvalue() == "".join(TEXTS) and last == FINAL
    (call,) = runtime.calls
    assert call["EndpointName"] == "ep-1"
    assert call["ContentType"] == "application/json"
    assert json.loads(call["Body"]) == {"prompt": "Today the weather is", "max_new_tokens": 64, "stream": True}


def test_plain_body_is_the_seeds_bytes():
    assert request_body("Today 天气", 10, plain=True) == ("Today 天气".encode(), "text/plain")


def test_model_stream_error_event_raises():
    stream = events([b'{"text": "a"}\n']) + [{"ModelStreamError": {"ErrorCode": "ModelError", "Message": "boom"}}]
    out = io.StringIO()
    with pytest.raises(StreamError, match="ModelStreamError: ModelError boom"):
        stream_text(sagemaker_payloads(FakeRuntime(stream), "ep", b"x", "text/plain"), out)
    assert out.getvalue() == "a"
