"""The embedding routes' request: the OpenAI body's envelope (pydantic), the inputs' own rules
(checked by hand, so a 400 names `input[i]`), and the parsed request the serving layer runs.

Text-generation fields are refused by name on every embedding route: a client that sends
`max_tokens` to an embedding archive has the wrong archive, and should be told so."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, StrictInt, StrictStr

from handler.api.common import Lenient
from handler.errors import InvalidRequest

EncodingFormat = Literal["float", "base64"]
Input = str | tuple[int, ...]  # a text, or the model's own token ids (special tokens included)

# Fields of the generation routes (OpenAI completions and chat, native, TGI parameters).
GENERATION_FIELDS = frozenset(
    {
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "n",
        "best_of",
        "stream",
        "stream_options",
        "stop",
        "stop_token_ids",
        "logprobs",
        "top_logprobs",
        "prompt_logprobs",
        "echo",
        "suffix",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "ignore_eos",
        "do_sample",
        "response_format",
        "grammar",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    }
)
SERVES_EMBEDDINGS = (
    "this archive serves embeddings (handler.task: embed: POST .../v1/embeddings, or a body with 'input' or "
    "'inputs'); text generation is served by an archive with handler.task: generate"
)


@dataclass(frozen=True)
class EmbeddingRequest:
    inputs: tuple[Input, ...]
    param: str  # the body's field holding the inputs: `input` (OpenAI, native) or `inputs` (feature extraction)
    single: bool = False  # one input given as such, not in a list: a 400 names `input`, not `input[0]`
    encoding_format: EncodingFormat = "float"
    dimensions: int | None = None

    def input_param(self, index: int) -> str:
        return self.param if self.single else f"{self.param}[{index}]"


class EmbeddingsBody(Lenient):
    """OpenAI's `POST /v1/embeddings` body (unknown fields are logged and ignored, e.g. `user`)."""

    input: Any
    model: StrictStr | None = None
    encoding_format: EncodingFormat | None = None
    dimensions: StrictInt | None = Field(default=None, ge=1)
    user: StrictStr | None = None


def refuse_generation_fields(body: dict[str, Any], prefix: str = "") -> None:
    """A text-generation field in an embedding request: a 400 naming it and the archives."""
    for name in body:
        if name in GENERATION_FIELDS:
            raise InvalidRequest(f"'{prefix}{name}' is a text-generation field: {SERVES_EMBEDDINGS}", prefix + name)


def parse_inputs(value: Any, param: str, max_inputs: int) -> tuple[tuple[Input, ...], bool]:
    """The inputs and whether one was given alone: a string, a list of strings, a list of token ids
    (one input) or a list of lists of token ids. Empty ones, other types, mixed lists and more than
    `max_inputs` are a 400 naming the field (`input` or `input[i]`)."""
    if isinstance(value, str):
        return (_text(value, param),), True
    if not isinstance(value, list):
        raise InvalidRequest(
            f"'{param}' must be a string, a list of strings, a list of token ids or a list of lists of token ids, "
            f"got {_kind(value)}",
            param,
        )
    if not value:
        raise InvalidRequest(f"'{param}' is an empty list: send at least one input", param)
    if _is_token_id(value[0]):
        return (_token_ids(value, param),), True
    if len(value) > max_inputs:
        raise InvalidRequest(
            f"'{param}' holds {len(value)} inputs; this server embeds at most {max_inputs} per request "
            "(handler.embed.max_inputs): send them in several requests",
            param,
        )
    if isinstance(value[0], list):
        return tuple(_token_ids(item, f"{param}[{i}]", nested=True) for i, item in enumerate(value)), False
    return tuple(_text(item, f"{param}[{i}]") for i, item in enumerate(value)), False


def _text(value: Any, param: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"'{param}' must be a string like the other inputs, got {_kind(value)}", param)
    if not value.strip():
        raise InvalidRequest(f"'{param}' is empty (or only whitespace): there is nothing to embed", param)
    return value


def _token_ids(value: Any, param: str, nested: bool = False) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise InvalidRequest(f"'{param}' must be a list of token ids like the other inputs, got {_kind(value)}", param)
    if not value:
        raise InvalidRequest(f"'{param}' is an empty list of token ids: there is nothing to embed", param)
    for j, item in enumerate(value):
        if not _is_token_id(item):
            where = f"{param}[{j}]"
            raise InvalidRequest(f"'{where}' must be a token id (an integer) like the others, got {_kind(item)}", where)
    return tuple(value)


def _is_token_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    return "null" if value is None else f"a JSON {_JSON_NAMES.get(type(value), type(value).__name__)}"


_JSON_NAMES = {str: "string", int: "number", float: "number", bool: "boolean", list: "array", dict: "object"}
