"""Requests that came through TorchServe's gRPC inference API, answered so that the frontend can
deliver them (0.11 and 0.12).

TorchServe's gRPC server cannot be switched off, and its continuous-batching path has two defects
a handler must work around (read from `GRPCJob` and `ContinuousBatching` at both tags):
- `GRPCJob.response` reads the reply's `ts_stream_next` header with `.equals` for StreamPredictions:
  a reply without it (one plain response) throws, and the worker is restarted with every stream in it;
- `GRPCJob.isOpen()` returns the observer's `isCancelled()`, so the frontend drops every gRPC job
  after its first reply: a streamed answer would be cut after its first chunk, with status OK.
So a gRPC request is generated whole (as if `stream` were false) and answered in ONE reply that
carries `ts_stream_next: false`: unary Predictions gets the whole result, StreamPredictions gets it
as one message and its end.

A refused request (a 4xx/5xx) arrives as the route's JSON error body with gRPC status OK, and the
handler cannot do better: `GRPCJob.response` ignores a reply's status code. The frontend gives a
gRPC job an error status (`GRPCJob.sendError`, 400 -> INVALID_ARGUMENT ...) only for a worker
message whose whole-batch code is not 200 (an exception out of `handle()`), and then fails every
job of the batch; in continuous batching that is every request in flight on the worker. So no
reply here asks for it (the source, with lines: docs/operations.md#grpc).
"""

from __future__ import annotations

from typing import Any

STREAM_NEXT = "ts_stream_next"


def is_grpc(context: Any, index: int, row: Any) -> bool:
    """A gRPC request carries no HTTP header at all: its only "headers" are its input names
    (`data`, ...), where an HTTP request has Host, Content-Length and the rest too. (No headers at
    all is not gRPC: TorchServe 0.11 re-sends a job in flight without any.)"""
    try:
        headers = context.get_all_request_header(index) or {}
    except (AttributeError, IndexError, TypeError):
        return False
    names = set(row) if isinstance(row, dict) else set()
    return bool(headers) and set(headers) <= names


def end_grpc_reply(context: Any, index: int) -> None:
    """Mark the reply as the last of its job (what GRPCJob.response reads for StreamPredictions); a
    stopping criterion that returns True or None leaves it so."""
    context.set_response_header(index, STREAM_NEXT, "false")
