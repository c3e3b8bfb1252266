"""What the wire formats share: body decoding, pydantic validation errors as a 400 naming the
field, the lenient base model, the ignored-fields log line, JSON and SSE framing, and the
limits on stop strings and token budgets. Each route keeps only its own wording."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from handler.api.json_tree import check_json_tree, printable
from handler.errors import InvalidRequest, ModelNotFound
from handler.grammar.grammars import json_schema_text
from handler.request import Constraint, Limits

logger = logging.getLogger(__name__)

MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300  # OpenAI's own limit on logit_bias entries
N_MAX = 8  # the most outputs one request may ask for (OpenAI `n`)
Model = TypeVar("Model", bound=BaseModel)


class Lenient(BaseModel):
    """A request body model that keeps unknown fields (`model_extra`): they are logged and
    ignored, as OpenAI's reference allows and TGI's router does."""

    model_config = ConfigDict(extra="allow", frozen=True)


def decode_body(body: Any, max_depth: int = 64) -> dict[str, Any] | str:
    """TorchServe hands the body over as dict (decoded JSON), str, or bytes. Whatever the form,
    the result holds only valid Unicode and nests at most `max_depth` levels (handler/api/json_tree.py)."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})", "body") from None
    if isinstance(body, str):
        body = body.removeprefix("\ufeff")  # a UTF-8 byte order mark some clients write before JSON
        stripped = body.lstrip()
        if not stripped.startswith(("{", "[")):
            check_json_tree(body, max_depth)
            return body
        try:
            body = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not valid JSON: {exc.msg} at position {exc.pos}", "body") from None
        except RecursionError:  # TorchServe's own decode gave up for the same reason and passed the bytes on
            raise InvalidRequest(f"the request body is nested deeper than {max_depth} levels", "body") from None
        except ValueError as exc:  # e.g. an integer of more than 4,300 digits (Python's int conversion limit)
            raise InvalidRequest(f"request body is not valid JSON: {str(exc)[:120]}", "body") from None
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"request body must be a JSON object or plain text, got a JSON {type(body).__name__}", "body"
        )
    check_json_tree(body, max_depth)
    return body


def validated(
    model: type[Model], data: dict[str, Any], name: Callable[[list[Any]], str] | None = None, quote: str = "'"
) -> Model:
    """`data` validated by `model`; the first problem as an `InvalidRequest` naming the field
    (its path in the body, without pydantic's union tags: `prompt.str` -> `prompt`), spelt by
    `name` (default: the dotted path) and quoted as the route quotes."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        missing = err["type"] == "missing"
        path = body_path(data, err["loc"], missing)
        param = (name or dotted)(path) or "body"
        if missing:
            raise InvalidRequest(f"{quote}{param}{quote} is required", param) from None
        raise InvalidRequest(f"{quote}{param}{quote}: {err['msg']}", param) from None


def dotted(path: list[Any]) -> str:
    return ".".join(str(part) for part in path)


def body_path(data: Any, loc: tuple[Any, ...], missing: bool) -> list[Any]:
    """The error's location in the body, without the names pydantic gives union members."""
    path: list[Any] = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        elif not (missing and isinstance(node, dict)):
            continue  # a union member's name, not a place in the body
        path.append(part)
    return path


LOGGED_FIELDS = 20  # names of ignored fields one log line quotes; the rest are counted


def log_ignored(route: str, fields: Iterable[str]) -> None:
    """One bounded log line naming the body fields a route ignores (unknown or not supported)."""
    names = sorted(fields)
    if names:
        shown = ", ".join(printable(name)[:64] for name in names[:LOGGED_FIELDS])
        more = f" and {len(names) - LOGGED_FIELDS} more" if len(names) > LOGGED_FIELDS else ""
        logger.info("%s: ignoring unknown request fields: %s%s", route, shown, more)


def extra_fields(model: BaseModel, prefix: str = "") -> list[str]:
    return [prefix + key for key in model.model_extra or {}]


def compact_json(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(obj: Any, field: str = "data: ") -> str:
    """One server-sent event (OpenAI writes `data: `, TGI `data:`)."""
    return f"{field}{compact_json(obj)}\n\n"


def checked_max_new_tokens(value: int | None, limits: Limits, param: str) -> int:
    """The request's token budget (the default when absent), within the deployment's limit."""
    if value is None:
        return limits.default_max_new_tokens
    if not 1 <= value <= limits.max_new_tokens:
        raise InvalidRequest(f"{param} must be between 1 and {limits.max_new_tokens}, got {value}", param)
    return value


def stop_strings(
    stop: str | list[str] | None,
    limits: Limits,
    too_many: str = "at most {limit} stop strings are allowed, got {count}",
    empty: str = "stop strings must not be empty",
) -> tuple[str, ...]:
    """Up to `limits.max_stop_strings` non-empty stop strings of at most `limits.max_stop_chars`
    characters in all (the messages in the route's words)."""
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if len(stops) > limits.max_stop_strings:
        raise InvalidRequest(too_many.format(limit=limits.max_stop_strings, count=len(stops)), "stop")
    if any(s == "" for s in stops):
        raise InvalidRequest(empty, "stop")
    total = sum(len(s) for s in stops)
    if total > limits.max_stop_chars:
        raise InvalidRequest(
            f"stop strings may hold at most {limits.max_stop_chars} characters in all, got {total}", "stop"
        )
    return tuple(stops)


def json_schema_constraint(schema: Any, param: str) -> Constraint:
    """A request's JSON Schema as a constraint; a schema that is not a JSON object is that field's 400
    (whether the grammar engine can enforce it is checked on receipt, handler/serving/service.py)."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON Schema object, got {type(schema).__name__}", param)
    return Constraint("json_schema", json_schema_text(schema))


def grammar_constraint(grammar: Any, param: str = "grammar") -> Constraint:
    """TGI's `grammar` object: `{"type": "json", "value": <schema (or its JSON text)>}`,
    `{"type": "json_schema", "value": {"name", "schema"}}` or `{"type": "regex", "value": <regex>}`."""
    if not isinstance(grammar, dict) or "type" not in grammar or "value" not in grammar:
        raise InvalidRequest(f'{param} must be an object {{"type": "json" | "regex", "value": ...}}', param)
    kind, value = grammar["type"], grammar["value"]
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise InvalidRequest(f"{param}.value must be a non-empty regular expression", param)
        return Constraint("regex", value)
    if kind == "json_schema" and isinstance(value, dict) and "schema" in value:
        value = value["schema"]
    elif kind == "json" and isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"{param}.value is not valid JSON: {exc.msg}", param) from None
    elif kind not in ("json", "json_schema"):
        raise InvalidRequest(f"{param}.type must be json, json_schema or regex, got {kind!r}", param)
    return json_schema_constraint(value, param)


def logit_bias(bias: dict[str, float] | None, param: str = "logit_bias") -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias} map, biases in [-100, 100] (whether the ids are in the vocabulary
    is checked on receipt, where the vocabulary is known)."""
    if not bias:
        return ()
    if len(bias) > MAX_LOGIT_BIAS:
        raise InvalidRequest(f"{param} takes at most {MAX_LOGIT_BIAS} tokens, got {len(bias)}", param)
    out = []
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(f"{param} keys must be token ids, got {key!r}", param) from None
        if not -100 <= value <= 100 or value != value:
            raise InvalidRequest(f"{param} values must be between -100 and 100, got {value} for {key}", param)
        out.append((token, float(value)))
    return tuple(sorted(out))


def output_shaping(fields: Any) -> dict[str, Any]:
    """The SamplingParams fields that OpenAI's and the native body spell alike: `presence_penalty`,
    `frequency_penalty`, `logit_bias`, `min_tokens`, validated."""
    return {
        "presence_penalty": penalty(fields.presence_penalty, "presence_penalty"),
        "frequency_penalty": penalty(fields.frequency_penalty, "frequency_penalty"),
        "logit_bias": logit_bias(fields.logit_bias),
        "min_tokens": fields.min_tokens or 0,
    }


def penalty(value: float | int | None, param: str) -> float:
    """An OpenAI presence / frequency penalty, between -2 and 2 (0 when absent)."""
    if value is None:
        return 0.0
    if not -2.0 <= value <= 2.0:
        raise InvalidRequest(f"{param} must be between -2 and 2, got {value}", param)
    return float(value)


def served_model(
    requested: str | None, served: str, named_route: bool, adapters: Collection[str] = ()
) -> tuple[str, str | None]:
    """(the `model` a response names, the LoRA adapter the request runs with). A `model` naming a
    configured adapter selects it (vLLM's convention); the served model's name means the base. On a
    route that names its API (`v1/completions`, ...), any other `model` is a 404 `model_not_found`.
    A body routed by its shape (`/invocations`, `/predictions/<model>`: SageMaker's clients send
    whatever name) is served as is."""
    if requested is not None and requested in adapters:
        return requested, requested
    if not named_route:
        return requested or served, None
    if requested is not None and requested != served:
        shown = printable(requested)[:100]
        raise ModelNotFound(f"the model '{shown}' does not exist; this server serves '{served}'", "model")
    return served, None


def named_adapter(name: str | None, limits: Limits, param: str) -> str | None:
    """The LoRA adapter a body's `param` names (native `adapter`, TGI `adapter_id`); an unknown one is a
    400 naming that field."""
    if name is None or name in limits.adapters:
        return name
    known = ", ".join(sorted(limits.adapters)) or "none"
    raise InvalidRequest(
        f"'{param}': the adapter '{printable(name)[:100]}' is not served here (adapters: {known})", param
    )
