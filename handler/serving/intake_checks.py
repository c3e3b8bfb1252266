"""TorchServe's side of the request checks (handler/core/request_checks.py): the headers come
from the worker's context."""

from __future__ import annotations

from typing import Any

from handler.core.request_checks import FORM_TYPES, check_body_headers, fewest_tokens, longest_token_chars

__all__ = ["FORM_TYPES", "check_body_form", "fewest_tokens", "longest_token_chars"]


def check_body_form(context: Any, index: int) -> None:
    """A compressed or form-encoded body is a 415 naming the header (TorchServe passes compressed
    bytes on undecoded and splits a form body into fields)."""
    check_body_headers(_all_headers(context, index))


def _all_headers(context: Any, index: int) -> dict[str, Any] | None:
    try:
        return context.get_all_request_header(index)
    except (AttributeError, IndexError, TypeError):  # a context without headers (tests, 0.11 re-sends)
        return None
