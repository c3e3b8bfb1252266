"""A real sagemaker-runtime client whose HTTP answer is an encoded AWS event stream.

botocore's Stubber validates a stubbed response against the operation's output shape, and
for InvokeEndpointWithResponseStream that shape's `Body` is a structure: Stubber refuses a
`botocore.eventstream.EventStream` ("valid types: <class 'dict'>") and a dict iterates as
its keys, not as events. So the tests replace only the network: a `before-send` handler
answers the signed request with the bytes of `application/vnd.amazon.eventstream` messages.
Everything else is botocore's own: parameter validation, serialization, the event-stream
decoder, the parser, and `EventStreamError` for exception events.
"""

from __future__ import annotations

import binascii
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.awsrequest import AWSPreparedRequest, AWSResponse

STRING_HEADER = 7  # the event-stream header value type of a UTF-8 string
OPERATION_EVENT = "before-send.sagemaker-runtime.InvokeEndpointWithResponseStream"


def encode_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude (lengths + CRC), headers, payload, message CRC."""
    encoded_headers = b""
    for name, value in headers.items():
        raw_name, raw_value = name.encode(), value.encode()
        encoded_headers += struct.pack("!B", len(raw_name)) + raw_name
        encoded_headers += struct.pack("!BH", STRING_HEADER, len(raw_value)) + raw_value
    total = 12 + len(encoded_headers) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded_headers))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    message = prelude + encoded_headers + payload
    return message + struct.pack("!I", binascii.crc32(message))


def payload_part(data: bytes) -> bytes:
    headers = {":message-type": "event", ":event-type": "PayloadPart", ":content-type": "application/octet-stream"}
    return encode_message(headers, data)


def exception_event(kind: str, message: str, error_code: str | None = None) -> bytes:
    """ModelStreamError / InternalStreamFailure, as SageMaker sends them inside the stream."""
    body: dict[str, str] = {"Message": message}
    if error_code:
        body["ErrorCode"] = error_code
    headers = {":message-type": "exception", ":exception-type": kind, ":content-type": "application/json"}
    return encode_message(headers, json.dumps(body).encode())


class RawStream:
    """What botocore reads an event stream from (urllib3's response): stream() and close()."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    def stream(self, *_: Any, **__: Any) -> Iterator[bytes]:
        yield from self.chunks

    def close(self) -> None:
        self.closed = True


@dataclass
class StreamingEndpoint:
    """Answers InvokeEndpointWithResponseStream with `chunks` (the encoded stream, cut anywhere)."""

    chunks: list[bytes]
    status: int = 200
    error_body: bytes = b""
    requests: list[AWSPreparedRequest] = field(default_factory=list)

    def __call__(self, request: AWSPreparedRequest, **_: Any) -> AWSResponse:
        self.requests.append(request)
        if self.status != 200:
            headers = {"Content-Type": "application/json", "x-amzn-ErrorType": "ModelError"}
            return AWSResponse(request.url, self.status, headers, RawStream([self.error_body]))
        headers = {
            "Content-Type": "application/vnd.amazon.eventstream",
            "X-Amzn-SageMaker-Content-Type": "application/x-ndjson",
        }
        return AWSResponse(request.url, 200, headers, RawStream(self.chunks))


def runtime_client(endpoint: StreamingEndpoint, region: str = "us-west-2") -> Any:
    """A real boto3 sagemaker-runtime client (fake credentials) whose network is `endpoint`."""
    client = boto3.client(
        "sagemaker-runtime", region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing"
    )
    client.meta.events.register(OPERATION_EVENT, endpoint)
    return client
