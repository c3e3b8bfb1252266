"""Drive the handler the way TorchServe's Python worker does, without Java.

`run_batch` builds a real `ts.context.Context` for one frontend batch, gives it a
socket that records what the handler streams, calls `handle` as `ts.service` does,
then encodes the final replies with TorchServe's own `create_predict_response`.
Every frame is decoded back into per-request replies, with the `time.perf_counter()`
moment it was sent, so a test can tell text that went out while the model was still
generating (`generation_ends`) from text sent all at once at the end.
"""

from __future__ import annotations

import itertools
import json
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from ts.context import Context, RequestProcessor
from ts.protocol.otf_message_handler import create_predict_response

from handler.serving.ts_compat import TORCHSERVE_VERSION

# The continuous protocol's two dialects, for tests that drive both with ContinuousFrontend.
# Replies are encoded by the installed TorchServe's own create_predict_response, and 0.11's
# turns a None stopping criterion into "continue": the 0.12 dialect needs 0.12 installed.
PROTOCOL_VERSIONS = [
    pytest.param((0, 11), id="0.11"),
    pytest.param(
        (0, 12),
        id="0.12",
        marks=pytest.mark.skipif(
            TORCHSERVE_VERSION < (0, 12), reason="0.11's frame encoder cannot speak the 0.12 dialect; runs on 0.12"
        ),
    ),
]


class RecordingSocket:
    def __init__(self) -> None:
        self.frames: list[bytes] = []
        self.sent_at: list[float] = []  # time.perf_counter() when each frame was sent

    def sendall(self, data: bytes) -> None:
        self.sent_at.append(time.perf_counter())
        self.frames.append(bytes(data))


class RecordingMetrics:
    """TorchServe's `context.metrics`: keeps what the handler adds (`add_metric`'s name and value),
    accepts every other call."""

    def __init__(self) -> None:
        self.added: list[tuple[str, float]] = []

    def add_metric(self, name: str, value: float, *args: Any, **kwargs: Any) -> None:
        self.added.append((name, value))

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
    ctx.metrics = RecordingMetrics()
    return ctx


def _read(buf: memoryview, pos: int) -> tuple[bytes, int]:
    (length,) = struct.unpack_from("!i", buf, pos)
    pos += 4
    if length < 0:
        return b"", pos
    return bytes(buf[pos : pos + length]), pos + length


def load_failure(handler: Any, context: Context) -> str:
    """initialize() a handler whose model must fail to load; the cause it serves its 503s with.
    The handler enters the failed state (handler/serving/init_failure.py) instead of raising."""
    from handler.serving.init_failure import FailedServing

    handler.initialize(context)
    assert isinstance(handler.serving, FailedServing), f"the model loaded: {handler.serving!r}"
    return handler.serving.cause


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
    """Within the block, the list gets the `time.perf_counter()` moment each backend
    `decode` step returned or raised; the last one is when generation ended.

    A chunk sent before that moment went out while the model was still generating; one
    buffered until generation ended is sent after it. An ordering, not a duration, so it
    holds however busy the machine is."""
    backend = handler.serving.service.backend
    ends: list[float] = []
    lock = threading.Lock()
    original = backend.decode
    own = vars(backend).get("decode")

    def timed_decode(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        finally:
            with lock:
                ends.append(time.perf_counter())

    backend.decode = timed_decode
    try:
        yield ends
    finally:
        if own is None:
            del backend.decode  # the class's method again
        else:
            backend.decode = own


def assert_streamed_while_generating(reply: Reply, generation_ended: float) -> None:
    """More than one chunk, and the first was sent before generation ended (the last of
    `generation_ends`): text went out while the model was still generating."""
    assert len(reply.sent_at) > 1, f"{len(reply.sent_at)} streamed chunk(s): the text went out in one piece"
    lead = generation_ended - reply.sent_at[0]
    assert lead > 0, f"first chunk sent {-lead:.4f} s after generation ended: buffered, not streamed"


# -- continuous batching ----------------------------------------------------------------
@dataclass
class StreamReply(Reply):
    """One request's HTTP response as TorchServe's frontend would write it in continuous mode."""

    done: bool = False  # the response ended (last chunk, or one plain response)
    streamed: bool = False  # a chunked response (ts_stream_next "true" at least once)
    broken: bool = False  # something a real client would see as a malformed response
    replies: int = 0  # replies the handler made for this request
    closed: bool = False  # the connection is closed (the client left, or a plain 4xx/5xx response)
    headers: dict[str, str] = field(default_factory=dict)  # the handler's response headers (the first reply's)

    @property
    def body(self) -> str:
        return "".join(self.chunks)


_REQUEST_NUMBERS = itertools.count()


class ContinuousFrontend:
    """TorchServe's `ContinuousBatching` + `RestJob` (0.11 and 0.12, by the installed
    release), driving the real handler and encoding with TorchServe's own worker code.

    Each `call()` is one `handle()` call: every request in flight (re-sent with an empty
    body; headers too on 0.12, none on 0.11) plus new arrivals, up to `batch_size`. A
    reply with ts_stream_next "true" opens or continues a chunked response, "false" ends
    it, and no header is one plain response (0.12 then drops the job; 0.11 keeps it).
    A request the handler leaves out of its reply stays in flight."""

    def __init__(self, handler: Any, context: Context, batch_size: int = 8, version: tuple[int, int] | None = None):
        self.handler = handler
        self.context = context
        self.batch_size = batch_size
        self.version = version or TORCHSERVE_VERSION
        self.queue: list[tuple[str, Any, dict]] = []  # not yet handed to the worker
        self.in_flight: dict[str, tuple[Any, dict]] = {}
        self.cached: set[str] = set()
        self.replies: dict[str, StreamReply] = {}
        self.calls = 0

    def submit(self, body: Any, headers: dict | None = None) -> str:
        request_id = f"req-{next(_REQUEST_NUMBERS)}"  # unique per process, as TorchServe's UUIDs are
        self.queue.append((request_id, body, dict(headers or {})))
        self.replies[request_id] = StreamReply()
        return request_id

    def cancel(self, request_id: str) -> None:
        """The client closed its connection. As in ContinuousBatching.sendResponse, the frontend
        notices only after a reply with ts_stream_next "true" (`RestJob.isOpen`) and then drops
        the job; a job still queued is handed to the worker all the same."""
        self.replies[request_id].closed = True

    @property
    def busy(self) -> bool:
        return bool(self.in_flight or self.queue)

    def call(self) -> None:
        while self.queue and len(self.in_flight) < self.batch_size:
            request_id, body, headers = self.queue.pop(0)
            self.in_flight[request_id] = (body, headers)
        if not self.in_flight:
            return
        ids = list(self.in_flight)
        data, processors = [], []
        for request_id in ids:
            body, headers = self.in_flight[request_id]
            cached = request_id in self.cached
            data.append({} if cached else {"body": body})
            send_headers = headers if (not cached or self.version >= (0, 12)) else {}
            processors.append(RequestProcessor(dict(send_headers)))
        req_ids = {i: request_id for i, request_id in enumerate(ids)}
        self.context.request_ids = req_ids
        self.context.request_processor = processors
        self.context.stopping_criteria = None
        self.context.cl_socket = RecordingSocket()
        ret = self.handler.handle(data, self.context)
        self.calls += 1
        assert isinstance(ret, list) and len(ret) == len(data), ret
        frame = create_predict_response(ret, req_ids, "Prediction success", 200, self.context)
        sent_at = time.perf_counter()
        decoded = decode_frame(frame, len(req_ids)) if req_ids else []
        for request_id, status, content_type, headers, body in decoded:
            reply = self.replies[request_id]
            if not (reply.streamed or reply.done):
                reply.headers = {k: v for k, v in headers.items() if k != "ts_stream_next"}
            self._respond(request_id, status, content_type, headers.get("ts_stream_next"), body, sent_at)

    def _respond(self, request_id: str, status: int, content_type: str, stream_next: str | None, body: str, at: float):
        reply = self.replies[request_id]
        reply.replies += 1
        if reply.closed:  # written to a closed connection: nobody sees it, and the job ends
            if stream_next is not None or self.version >= (0, 12):  # "true": isOpen() is false
                self.in_flight.pop(request_id, None)
            return
        if reply.done:
            reply.broken = True  # a reply after the response ended
        if stream_next == "true":
            if not reply.streamed:
                reply.streamed, reply.status, reply.content_type = True, status, content_type
                if status >= 400:  # the connection is closed after the headers: the body is lost
                    reply.broken = reply.closed = True
            self._chunk(reply, body, at)
            self.cached.add(request_id)
            return
        if stream_next == "false":
            if not reply.streamed:
                reply.broken = True  # 'last chunk' without a status line: TorchServe writes a broken response
            self._chunk(reply, body, at)
            reply.done = True
            self.in_flight.pop(request_id, None)
            return
        # no header: one plain response
        if reply.streamed:
            reply.broken = True
        reply.status, reply.content_type = status, content_type
        self._chunk(reply, body, at)
        reply.done = True
        # TorchServe closes the connection after a 4xx/5xx (NettyUtils.sendHttpResponse)
        reply.closed = status >= 400
        if self.version >= (0, 12):
            self.in_flight.pop(request_id, None)
        else:
            self.cached.add(request_id)  # 0.11 keeps the job in flight (until it sees the connection closed)

    @staticmethod
    def _chunk(reply: StreamReply, body: str, at: float) -> None:
        if body:  # Netty writes no chunk for an empty body
            reply.chunks.append(body)
            reply.sent_at.append(at)

    def run(self, max_calls: int = 10_000) -> None:
        """Call until nothing is in flight."""
        for _ in range(max_calls):
            if not self.busy:
                return
            self.call()
        raise AssertionError(f"still busy after {max_calls} calls: {sorted(self.in_flight)}")

    def serve(self, bodies: list[Any], headers: list[dict] | None = None) -> list[StreamReply]:
        """Submit the bodies together and run them to the end."""
        ids = [self.submit(b, (headers or [{}] * len(bodies))[i]) for i, b in enumerate(bodies)]
        self.run()
        return [self.replies[i] for i in ids]
