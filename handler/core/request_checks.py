"""Checks of a request before its body is read, its prompt tokenized or its constraint compiled:
the body's declared form (its headers), a prompt's length against the vocabulary's longest token,
so that a prompt that can never fit costs nothing to refuse, and a constraint's size."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from handler.api.json_tree import printable
from handler.errors import InvalidRequest, UnsupportedMediaType
from handler.request import Constraint

FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def check_body_headers(headers: Mapping[str, Any] | None) -> None:
    """A body in a form the handler cannot read as sent is a 415 naming the header: compressed
    (passed on undecoded) or form-encoded (a frontend may split it into form fields, and a JSON
    body is lost)."""
    lowered = {str(k).lower(): v for k, v in (headers or {}).items()}
    encoding = str(lowered.get("content-encoding") or "").strip()
    if encoding and encoding.lower() != "identity":
        raise UnsupportedMediaType(
            f"Content-Encoding '{printable(encoding)[:40]}' is not accepted: send the body uncompressed",
            "Content-Encoding",
        )
    content_type = str(lowered.get("content-type") or "").split(";")[0].strip().lower()
    if content_type in FORM_TYPES:
        raise UnsupportedMediaType(
            f"Content-Type '{content_type}' is not accepted: send JSON with Content-Type: application/json "
            "(or plain text)",
            "Content-Type",
        )


def longest_token_chars(tokenizer: Any) -> int | None:
    """The most characters one token of the vocabulary stands for (its spelling in the vocabulary:
    a byte-level token is spelt one character per byte, never fewer than the text it decodes to),
    special tokens included; None when the tokenizer has no vocabulary to read."""
    try:
        vocab = tokenizer.get_vocab()
    except Exception:  # a tokenizer without a readable vocabulary: no bound, tokenize everything
        return None
    return max((len(token) for token in vocab), default=None)


def fewest_tokens(text: str, longest_token_chars: int | None) -> int:
    """A lower bound on the tokens of `text`: no token covers more than `longest_token_chars`
    characters. Halved, for a normalizer that drops characters before tokenizing (a refused prompt
    must be a prompt that could never fit): tokenizing costs at most twice the longest prompt."""
    if not longest_token_chars:
        return 0
    return len(text) // (2 * longest_token_chars)


def check_constraint_size(constraint: Constraint, limit: int, param: str) -> None:
    """A constraint over `limit` UTF-8 bytes (`handler.grammar.max_constraint_bytes`) is a 400 naming
    its field, before anything compiles it."""
    size = len(constraint.value.encode("utf-8", "surrogatepass"))  # a TGI schema text may hold a lone surrogate
    if size > limit:
        raise InvalidRequest(
            f"{param} is {size:,} bytes; this server takes schemas and grammars of at most {limit:,} bytes "
            "(handler.grammar.max_constraint_bytes)",
            param,
        )
