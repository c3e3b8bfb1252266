"""Drive the handler the way TorchServe's Python worker does, without Java.

`run_batch` builds a real `ts.context.Context` for one frontend batch, gives it a
socket that records what the handler streams, calls `handle` as `ts.service` does,
then encodes the final replies with TorchServe's own `create_predict_response`.
Every frame is decoded back into per-request replies, with the `time.perf_counter()`
moment it was sent, so a test can tell text that went out while the model was still
generating (`generation_ends`) from text sent all at once at the end.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from ts.context import Context, RequestProcessor
from ts.protocol.otf_message_handler import create_predict_response


class RecordingSocket:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.sent_at: list[float] = []  # time.perf_counter() when each frame was sent

    def sendall(self, data: bytes) -> None:
        self.sent_at.append(time.perf_counter())
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
    sent_at: list[float] = field(default_factory=list)  # perf_counter when each chunk was sent
    handle_returned: float = 0.0  # perf_counter when handle() returned (the final reply goes after)

    @property
    def sent_before_return_s(self) -> list[float]:
        """How long before handle() returned each streamed chunk was sent (negative: after)."""
        return [self.handle_returned - t for t in self.sent_at]

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
    returned = time.perf_counter()
    assert isinstance(ret, list) and len(ret) == len(data), ret
    socket.sendall(create_predict_response(ret, req_ids, "Prediction success", 200, context))
    replies = {rid: Reply(handle_returned=returned) for rid in req_ids.values()}
    for frame, sent_at in zip(socket.frames[:-1], socket.sent_at[:-1], strict=True):
        for req_id, status, _, _, body in decode_frame(frame, 1):
            replies[req_id].chunks.append(body)
            replies[req_id].sent_at.append(sent_at)
            replies[req_id].status = replies[req_id].status or status
    for req_id, status, content_type, _, body in decode_frame(socket.frames[-1], len(data)):
        reply = replies[req_id]
        reply.final = body
        reply.status = reply.status or status
        reply.content_type = content_type
    return [replies[req_ids[i]] for i in range(len(data))]


@contextmanager
def generation_ends(handler: Any) -> Iterator[list[float]]:
    """Within the block, the list gets the `time.perf_counter()` moment each call of the
    handler's backend `generate` (one micro-batch's whole generation) returned or raised.

    A chunk sent before that moment went out while its micro-batch was still generating;
    one buffered until generation ended is sent after it. An ordering, not a duration,
    so it holds however busy the machine is."""
    backend = handler.service.backend
    ends: list[float] = []
    lock = threading.Lock()
    original = backend.generate
    own = vars(backend).get("generate")

    def timed_generate(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                ends.append(time.perf_counter())

    backend.generate = timed_generate
    try:
        yield ends
    finally:
        if own is None:
            del backend.generate  # the class's method again
        else:
            backend.generate = own


def assert_streamed_while_generating(reply: Reply, generation_ended: float) -> None:
    """More than one chunk, and the first was sent before its micro-batch's generation
    ended (`generation_ends`): text went out while the model was still generating."""
    assert len(reply.sent_at) > 1, f"{len(reply.sent_at)} streamed chunk(s): the text went out in one piece"
    lead = generation_ended - reply.sent_at[0]
    assert lead > 0, f"first chunk sent {-lead:.4f} s after generation ended: buffered, not streamed"
