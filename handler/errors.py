"""The error taxonomy, and the one place that maps it to HTTP."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any


class ConfigError(ValueError):
    """model-config.yaml is wrong; the message names the key and how to fix it."""


class ServingError(Exception):
    """An error that is answered to one request; the worker keeps serving."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None  # a machine-readable reason, where a wire format carries one (OpenAI's `code`)
    retry_after_s: int | None = None  # answered with a Retry-After header (seconds)

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled whole (a replica process sends a failed sequence's error to the worker)."""
        return type(self), (self.message, self.param)


class InvalidRequest(ServingError):
    """The request itself is wrong: fixing it is up to the client."""

    status = 400
    error_type = "invalid_request_error"


class UnsupportedMediaType(ServingError):
    """The body comes in a form the server does not read (compressed, form-encoded): say which."""

    status = 415
    error_type = "invalid_request_error"


class NotFound(ServingError):
    status = 404
    error_type = "not_found_error"


class ModelNotFound(NotFound):
    """A route that names its model got another name (OpenAI's and vLLM's answer: 404 `model_not_found`)."""

    code = "model_not_found"


class EngineError(ServingError):
    """Generation failed inside the model; the request may be retried."""

    status = 500
    error_type = "server_error"


class ServiceUnavailable(ServingError):
    """The server is shutting down (draining): retry elsewhere or later."""

    status = 503
    error_type = "service_unavailable"


class Overloaded(ServiceUnavailable):
    """Too busy to serve this request now (no slot within the wait a request may have, or too many in
    flight): a fast 503 that says when to retry (`Retry-After`), and `reason` for the metrics."""

    retry_after_s = 1

    def __init__(self, message: str, reason: str, param: str | None = None) -> None:
        super().__init__(message, param)
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return type(self), (self.message, self.reason, self.param)


class ModelLoadFailed(ServingError):
    """This worker could not load the model (handler/serving/init_failure.py): it answers at once
    instead of letting requests queue, and restarts after a hold time."""

    status = 503
    error_type = "model_load_failed"


@dataclass(frozen=True)
class HttpError:
    status: int
    phrase: str
    body: dict[str, Any]


def to_http(error: ServingError) -> HttpError:
    """Status, reason phrase and the `{"error": {...}}` body for one failed request."""
    body = {"error": {"message": error.message, "param": error.param, "type": error.error_type}}
    return HttpError(error.status, HTTPStatus(error.status).phrase, body)
