"""What the serving modes and the failed-start worker share about replies: the plain error
response, and TorchServe 0.11's habit of re-sending a job that was answered in full."""

from __future__ import annotations

from typing import Any

from handler.api.base import Api
from handler.api.embeddings import EmbeddingApi
from handler.api.json_tree import printable
from handler.core.replies import STREAM_HEADERS, STREAMED_TYPES, wire_error
from handler.errors import ServingError

__all__ = [
    "STREAMED_TYPES",
    "STREAM_HEADERS",
    "AnsweredInFull",
    "encodable",
    "error_reply",
    "set_content_type",
    "wire_error",
]


def error_reply(context: Any, index: int, api: Api | EmbeddingApi, error: ServingError) -> str:
    """A request that fails before anything of it was sent: the route's status and reason, a JSON
    content type, and the route's error body, as one plain response."""
    status, phrase = api.http_status(error)
    context.set_response_status(status, phrase, index)
    context.set_response_content_type(index, "application/json")
    return api.error(error, midstream=False)


def encodable(replies: list[Any]) -> list[Any]:
    """The replies with every text made UTF-8-encodable. TorchServe's worker encodes each reply
    outside any handler code, and a text it cannot encode (a lone surrogate echoed from a request)
    ends the worker process and every stream in it. Bodies are checked on receipt
    (handler/api/json_tree.py); this is the last line, whatever a reply came to echo."""
    return [printable(r) if isinstance(r, str) and not r.isascii() else r for r in replies]


def set_content_type(context: Any, index: int, content_type: str) -> None:
    """The response's content type, and for a stream the headers that keep proxies from buffering it."""
    context.set_response_content_type(index, content_type)
    if content_type in STREAMED_TYPES:
        for name, value in STREAM_HEADERS.items():
            context.set_response_header(index, name, value)


class AnsweredInFull:
    """Continuous jobs answered with one plain response under TorchServe 0.11, which keeps such a
    job in the batch and re-sends it: the next call ends it with an empty last chunk (0.12 drops
    it). An id leaves when that call ends it, or when the frontend stops sending it."""

    def __init__(self) -> None:
        self._ids: set[str] = set()

    def add(self, request_id: str) -> None:
        self._ids.add(request_id)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._ids

    def __bool__(self) -> bool:
        return bool(self._ids)

    def __iter__(self):
        return iter(list(self._ids))

    def end(self, request_id: str) -> bool:
        """Forget the id; whether it was one of ours."""
        if request_id in self._ids:
            self._ids.discard(request_id)
            return True
        return False

    def keep_only(self, present: set[str]) -> None:
        """The frontend no longer sends the others: they are gone."""
        self._ids &= present

    def clear(self) -> None:
        self._ids.clear()
