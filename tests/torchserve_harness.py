"""Drive the handler the way TorchServe's Python worker does, without Java.

`run_batch` builds a real `ts.context.Context` for one frontend batch, gives it a
socket that records what the handler streams, calls `handle` as `ts.service` does,
then encodes the final replies with TorchServe's own `create_predict_response`.
Every frame is decoded back into per-request replies.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

from ts.context import Context, RequestProcessor
from ts.protocol.otf_message_handler import create_predict_response


class RecordingSocket:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.frames.append(bytes(data))


class NullMetrics:
    def add_time(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


@dataclass
class Reply:
    chunks: list[str] = field(default_factory=list)  # intermediate (streamed) bodies
    final: str = ""
    status: int = 0
    content_type: str | None = None

    @property
    def lines(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in ("".join(self.chunks) + self.final).splitlines() if line]

    @property
    def streamed_text(self) -> str:
        return "".join(line.get("text", "") for line in self.lines)


def make_context(model_yaml_config: dict[str, Any], model_dir: str) -> Context:
    ctx = Context("m", model_dir, {"model": {"modelName": "m"}}, 4, None, "0.12.0", model_yaml_config=model_yaml_config)
    ctx.metrics = NullMetrics()
    return ctx


def _read(buf: memoryview, pos: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("!i", buf, pos)
    pos += 4
    if length < 0:
        return b"", pos
    return bytes(buf[pos : pos + length]), pos + length


def decode_frame(frame: bytes, n_requests: int) -> list[tuple[str, int, str, dict[str, str], str]]:
    buf = memoryview(frame)
    pos = 4
    _, pos = _read(buf, pos)  # message
    out = []
    for _ in range(n_requests):
        req_id, pos = _read(buf, pos)
        content_type, pos = _read(buf, pos)
        (status,) = struct.unpack_from("!i", buf, pos)
        pos += 4
        _, pos = _read(buf, pos)  # phrase
        (n_headers,) = struct.unpack_from("!i", buf, pos)
        pos += 4
        headers = {}
        for _ in range(n_headers):
            key, pos = _read(buf, pos)
            value, pos = _read(buf, pos)
            headers[key.decode()] = value.decode()
        body, pos = _read(buf, pos)
        out.append((req_id.decode(), status, content_type.decode(), headers, body.decode("utf-8")))
        if pos >= len(frame):
            break
    return out


def run_batch(handler: Any, context: Context, rows: list[Any], headers: list[dict] | None = None) -> list[Reply]:
    """One frontend batch through `handler.handle`; rows are TorchServe input dicts or bodies."""
    data = [row if isinstance(row, dict) and ("body" in row or "data" in row) else {"body": row} for row in rows]
    req_ids = {i: f"req-{i}" for i in range(len(data))}
    context.request_ids = req_ids
    context.request_processor = [RequestProcessor(dict((headers or [{}] * len(data))[i])) for i in range(len(data))]
    socket = RecordingSocket()
    context.cl_socket = socket
    ret = handler.handle(data, context)
    assert isinstance(ret, list) and len(ret) == len(data), ret
    socket.sendall(create_predict_response(ret, req_ids, "Prediction success", 200, context))
    replies = {rid: Reply() for rid in req_ids.values()}
    for frame in socket.frames[:-1]:
        for req_id, status, _, _, body in decode_frame(frame, 1):
            replies[req_id].chunks.append(body)
            replies[req_id].status = replies[req_id].status or status
    for req_id, status, content_type, _, body in decode_frame(socket.frames[-1], len(data)):
        reply = replies[req_id]
        reply.final = body
        reply.status = reply.status or status
        reply.content_type = content_type
    return [replies[req_ids[i]] for i in range(len(data))]
