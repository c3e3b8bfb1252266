"""Pydantic models of `POST /v1/responses` bodies (OpenAI's Responses API).

Modelled: what this server honours, and what OpenAI defines that it cannot honour (so the route
refuses it by name, `REFUSED` in handler/api/responses/api.py). Input items are told apart by
`type`, as OpenAI's are; a message may leave `type` out (`{"role": "user", "content": "..."}`).
Tools are flat (`{"type": "function", "name", "parameters"}`), not nested under `function` as in
Chat Completions.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, StrictBool, StrictFloat, StrictInt, StrictStr, Tag

from handler.api.common import Lenient

Number = StrictFloat | StrictInt
MAX_METADATA = 16  # OpenAI's limits on `metadata`: 16 pairs, keys up to 64 characters, values up to 512
MAX_METADATA_KEY, MAX_METADATA_VALUE = 64, 512


class ContentPart(Lenient):
    """One part of a message's content. Text parts are served; an image, file or audio part is a
    400 naming it (this server reads text only)."""

    type: StrictStr
    text: StrictStr | None = None


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: StrictStr | list[ContentPart]
    id: StrictStr | None = None
    status: StrictStr | None = None


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    arguments: StrictStr
    id: StrictStr | None = None
    status: StrictStr | None = None


class _CallOutput(Lenient):
    """What a tool returned for one call, by its `call_id`."""

    call_id: StrictStr = Field(min_length=1)
    output: StrictStr | list[ContentPart]
    id: StrictStr | None = None


class FunctionCallOutputItem(_CallOutput):
    type: Literal["function_call_output"]
    status: StrictStr | None = None


class CustomToolCallItem(Lenient):
    type: Literal["custom_tool_call"]
    call_id: StrictStr = Field(min_length=1)
    name: StrictStr = Field(min_length=1)
    input: StrictStr
    id: StrictStr | None = None


class CustomToolCallOutputItem(_CallOutput):
    type: Literal["custom_tool_call_output"]


class OtherItem(Lenient):
    """An item of a type this server does not serve (reasoning, item_reference, a hosted tool's
    call): parsed only so that the 400 can name it."""

    type: StrictStr


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        kind = value.get("type", "message")
        return kind if kind in SERVED_ITEMS else "other"
    return getattr(value, "type", "other")


SERVED_ITEMS = ("message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output")
InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[CustomToolCallItem, Tag("custom_tool_call")]
    | Annotated[CustomToolCallOutputItem, Tag("custom_tool_call_output")]
    | Annotated[OtherItem, Tag("other")],
    Discriminator(_item_kind),
]


class GrammarFormat(Lenient):
    type: Literal["grammar"]
    syntax: Literal["lark", "regex"]
    definition: StrictStr = Field(min_length=1)


class TextFormat(Lenient):
    type: Literal["text"]


class FunctionTool(Lenient):
    type: Literal["function"]
    name: StrictStr = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    parameters: Any = None  # checked by tool_schemas (an object schema); None: no arguments
    strict: StrictBool | None = None


class CustomTool(Lenient):
    """A tool that takes free-form text (`custom_tool_call.input`), optionally in a grammar."""

    type: Literal["custom"]
    name: StrictStr = Field(min_length=1, pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: StrictStr | None = None
    format: GrammarFormat | TextFormat | None = None


class HostedTool(Lenient):
    """web_search, file_search, computer use, code interpreter, MCP, image generation...: refused."""

    type: StrictStr


def _tool_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in ("function", "custom") else "hosted"


ToolParam = Annotated[
    Annotated[FunctionTool, Tag("function")]
    | Annotated[CustomTool, Tag("custom")]
    | Annotated[HostedTool, Tag("hosted")],
    Discriminator(_tool_kind),
]


class NamedTool(Lenient):
    type: Literal["function", "custom"]
    name: StrictStr


class OtherToolChoice(Lenient):
    """`allowed_tools`, or a hosted tool's type: refused."""

    type: StrictStr


ToolChoice = Literal["none", "auto", "required"] | NamedTool | OtherToolChoice


class JsonSchemaText(Lenient):
    type: Literal["json_schema"]
    name: StrictStr = Field(min_length=1)
    schema_: Any = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class PlainText(Lenient):
    type: Literal["text", "json_object"]


class TextConfig(Lenient):
    format: JsonSchemaText | PlainText | None = None
    verbosity: StrictStr | None = None


class Reasoning(Lenient):
    effort: StrictStr | None = None
    summary: StrictStr | None = None
    generate_summary: StrictStr | None = None


class ResponsesRequest(Lenient):
    model: StrictStr | None = None
    input: StrictStr | list[InputItem] = Field(default="")
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number | None = Field(default=None, ge=0, le=2)
    top_p: Number | None = Field(default=None, gt=0, le=1)
    stream: StrictBool | None = False
    text: TextConfig | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None
    store: StrictBool | None = None
    previous_response_id: StrictStr | None = None
    metadata: dict[StrictStr, StrictStr] | None = None
    user: StrictStr | None = None
    # OpenAI's, refused unless neutral (handler/api/responses/api.py REFUSED).
    reasoning: Reasoning | None = None
    background: StrictBool | None = None
    include: list[StrictStr] | None = None
    truncation: StrictStr | None = None
    top_logprobs: StrictInt | None = None
    max_tool_calls: StrictInt | None = None
    prompt: Any = None
    conversation: Any = None
    # vLLM's extensions (through `extra_body`), as on the other OpenAI routes.
    seed: StrictInt | None = Field(default=None, ge=0, lt=2**63)
    top_k: StrictInt | None = Field(default=None, ge=-1, lt=2**31)
    ignore_eos: StrictBool | None = None
