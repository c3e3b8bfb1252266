"""The frontend's own refusals (key, method, size, slow body, unknown path), in the same
`{"error": {...}}` shape as every other error of the package, always JSON."""

from __future__ import annotations

import json
from http import HTTPStatus

from handler.errors import ServingError, to_http


class Unauthorized(ServingError):
    status = 401
    error_type = "authentication_error"


class MethodNotAllowed(ServingError):
    status = 405
    error_type = "invalid_request_error"


class RequestTimeout(ServingError):
    status = 408
    error_type = "invalid_request_error"


class PayloadTooLarge(ServingError):
    status = 413
    error_type = "invalid_request_error"


def error_body(error: ServingError) -> bytes:
    return json.dumps(to_http(error).body, ensure_ascii=False).encode()


def status_error(status: int, detail: str | None = None) -> ServingError:
    """The error for a status Starlette's router raised (404, 405)."""
    phrase = HTTPStatus(status).phrase
    if status == 405:
        return MethodNotAllowed(detail or "method not allowed on this path", "method")
    error = ServingError(detail or phrase, "url")
    error.status = status
    error.error_type = "not_found_error" if status == 404 else "invalid_request_error"
    return error
