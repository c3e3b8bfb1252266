"""scripts/sagemaker/stream.py: lines reassembled from event payloads split anywhere,
multi-byte UTF-8 characters included; the invoke call through a real botocore client
(parameters validated and serialized, the event stream decoded by botocore); errors in the
stream reported as a message and exit status 1."""

from __future__ import annotations

import io
import itertools
import json
import random

import pytest

from scripts.sagemaker.stream import (
    LineAssembler,
    StreamError,
    main,
    request_body,
    sagemaker_payloads,
    stream_text,
)
from tests.support.eventstream import StreamingEndpoint, exception_event, payload_part, runtime_client

TEXTS = ["Today ", "天气", "真好", " 🌞🏖️", ", café", "\n", "naïve ", "😀"]
FINAL = {"text": "", "finish_reason": "length", "usage": {"prompt_tokens": 5, "completion_tokens": 8}}


def ndjson() -> bytes:
    lines = [{"text": t} for t in TEXTS] + [FINAL]
    return "".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines).encode("utf-8")


def split_at(data: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


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


def encoded_stream(payloads: list[bytes], tail: bytes = b"") -> bytes:
    return b"".join(payload_part(part) for part in payloads) + tail


def test_invoke_parameters_and_payloads_through_botocore():
    """A real client: botocore validates and serializes the call, decodes the event stream (cut
    at arbitrary byte offsets, mid-message) and hands over PayloadPart bytes (cut mid-line and
    mid-character)."""
    data = ndjson()
    wire = encoded_stream(split_at(data, [3, 50, 51, 52, 200]))
    endpoint = StreamingEndpoint(split_at(wire, [1, 13, 97, 98, 400]))
    body, content_type = request_body("Today the weather is", 64, plain=False)
    out = io.StringIO()
    last = stream_text(sagemaker_payloads(runtime_client(endpoint), "ep-1", body, content_type), out)
    assert out.getvalue() == "".join(TEXTS) and last == FINAL
    (request,) = endpoint.requests
    assert request.url.endswith("/endpoints/ep-1/invocations-response-stream")
    assert request.headers["Content-Type"] == b"application/json"
    assert request.headers["X-Amzn-SageMaker-Accept"] == b"application/x-ndjson"
    assert json.loads(request.body) == {"prompt": "Today the weather is", "max_new_tokens": 64, "stream": True}


def test_plain_body_is_the_seeds_bytes():
    assert request_body("Today 天气", 10, plain=True) == ("Today 天气".encode(), "text/plain")


@pytest.mark.parametrize(
    ("kind", "message", "error_code"),
    [
        ("ModelStreamError", "Your model primary did not complete sending the inference response", "StreamBroken"),
        ("InternalStreamFailure", "The stream processing failed", None),
    ],
)
def test_an_error_event_raised_by_botocore_becomes_a_stream_error(kind, message, error_code):
    """botocore raises an exception event as EventStreamError while the stream is iterated
    (it is never an event dict): the text before it is kept, then a StreamError names it."""
    wire = encoded_stream([b'{"text": "a"}\n'], exception_event(kind, message, error_code))
    endpoint = StreamingEndpoint(split_at(wire, [20]))
    out = io.StringIO()
    with pytest.raises(StreamError, match=f"^{kind}: {message}$"):
        stream_text(sagemaker_payloads(runtime_client(endpoint), "ep", b"x", "text/plain"), out)
    assert out.getvalue() == "a"


def test_cli_reports_an_error_event_with_exit_status_1_and_no_traceback(capsys):
    wire = encoded_stream([b'{"text": "partial"}\n'], exception_event("ModelStreamError", "model timed out"))
    runtime = runtime_client(StreamingEndpoint([wire]))
    with pytest.raises(SystemExit) as exited:
        main(["--endpoint-name", "ep-1", "Today"], runtime=runtime)
    assert exited.value.code == 1
    captured = capsys.readouterr()
    assert captured.out == "partial"
    assert captured.err.strip() == "error: ModelStreamError: model timed out"


def test_cli_reports_a_model_error_before_any_event(capsys):
    """The container refused the request (here a 400 from the handler): SageMaker answers the
    call itself with ModelError, and the container's status and message are shown."""
    detail = {"error": {"message": "prompt is empty", "param": "prompt"}}
    error_body = {
        "Message": "Received client error (400) from primary",
        "OriginalStatusCode": 400,
        "OriginalMessage": json.dumps(detail),
    }
    endpoint = StreamingEndpoint([], status=424, error_body=json.dumps(error_body).encode())
    with pytest.raises(SystemExit) as exited:
        main(["--endpoint-name", "ep-1", " "], runtime=runtime_client(endpoint))
    assert exited.value.code == 1
    err = capsys.readouterr().err
    assert "error: ModelError: Received client error (400) from primary" in err
    assert "container answered 400" in err and "prompt is empty" in err
    assert "Traceback" not in err


def test_parameters_are_validated_by_botocore():
    """A real client refuses what the API does not take (a fake would have accepted it)."""
    endpoint = StreamingEndpoint([])
    with pytest.raises(StreamError, match=r"ParamValidationError: (?s:.*)Invalid type for parameter Body"):
        list(sagemaker_payloads(runtime_client(endpoint), "ep-1", 12345, "text/plain"))  # type: ignore[arg-type]
    assert endpoint.requests == []  # refused before anything was sent
