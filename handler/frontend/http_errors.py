"""The frontend's own refusals (key, method, size, slow body, unknown path), in the same
`{"error": {...}}` shape as every other error of the package, always JSON."""

from __future__ import annotations

from http import HTTPStatus

from handler.errors import InvalidRequest, NotFound, ServingError


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


def status_error(status: int, detail: str | None = None) -> ServingError:
    """The error for a status Starlette's router raised (404, 405)."""
    if status == 405:
        return MethodNotAllowed(detail or "method not allowed on this path", "method")
    if status == 404:
        return NotFound(detail or HTTPStatus(404).phrase, "url")
    error = InvalidRequest(detail or HTTPStatus(status).phrase, "url")
    error.status = status  # any other status the router raises: its own code, as a client error
    return error
