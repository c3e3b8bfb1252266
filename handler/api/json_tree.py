"""What every request body must be before any field of it is read: text that is valid Unicode
and nesting no deeper than the deployment allows.

JSON can carry a lone UTF-16 surrogate (`"\\ud800"`); Python decodes it into a `str` that no
UTF-8 encoder takes. Echoed into a reply (a `model` field, an error message) it made TorchServe's
worker raise while encoding the reply, outside any handler code, and the process died with every
stream in flight. Deep nesting makes recursive code (json, pydantic, grammar compilers) hit
Python's recursion limit. Both are the client's mistake: a 400 naming the field, at receipt.
"""

from __future__ import annotations

from typing import Any

from handler.errors import InvalidRequest

PARAM_LIMIT = 200  # characters of a field path quoted back to the client


def printable(text: str) -> str:
    """`text` with every character UTF-8 cannot encode (a lone surrogate) written as its `\\udxxx`
    escape: safe to echo into a reply or a log."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def check_json_tree(body: Any, max_depth: int) -> None:
    """Raise `InvalidRequest` for the first string (value or key) that is not valid Unicode, or
    the first array or object nested deeper than `max_depth` (the body itself is level 1).
    Iterative: the check itself cannot run out of stack."""
    stack: list[tuple[Any, tuple[Any, ...], int]] = [(body, (), 1)]
    while stack:
        node, path, depth = stack.pop()
        if isinstance(node, str):
            _check_text(node, path)
        elif isinstance(node, (dict, list)):
            if depth > max_depth:
                param = field_path(path)
                raise InvalidRequest(
                    f"the request body is nested deeper than {max_depth} levels (at '{param}')", param or "body"
                )
            if isinstance(node, dict):
                for key, value in node.items():
                    _check_text(str(key), (*path, key))
                    stack.append((value, (*path, key), depth + 1))
            else:
                stack.extend((value, (*path, i), depth + 1) for i, value in enumerate(node))


def _check_text(text: str, path: tuple[Any, ...]) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        param = field_path(path) or "body"
        bad = printable(text[exc.start : exc.start + 1])
        raise InvalidRequest(
            f"'{param}' is not valid Unicode text: a lone surrogate ({bad}) at character {exc.start}", param
        ) from None


def field_path(path: tuple[Any, ...]) -> str:
    """A place in the body as a dotted path (`messages.0.content`), printable and bounded."""
    dotted = printable(".".join(str(part) for part in path))
    return dotted if len(dotted) <= PARAM_LIMIT else dotted[: PARAM_LIMIT - 1] + "…"
