"""What any frontend's replies share: an engine error in the route's words, and the headers
that keep proxies from buffering a stream."""

from __future__ import annotations

from handler.api.base import Api
from handler.errors import ServingError


def wire_error(api: Api, error: ServingError) -> ServingError:
    """An error the engine raised for a sequence, its `param` in the route's words: the engine names
    request fields by their domain names (`constraint`), a client knows them by the wire's
    (`response_format.json_schema.schema`, `tools`, `parameters.grammar`)."""
    if error.param is None:
        return error
    wired = api.wire_name(error.param)
    return error if wired == error.param else type(error)(error.message, wired)


STREAMED_TYPES = ("text/event-stream", "application/x-ndjson")
# A proxy must pass every chunk on as it comes: nginx buffers a response unless told not to
# (X-Accel-Buffering), and no cache may hold a stream back (Cache-Control).
STREAM_HEADERS = {"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}
