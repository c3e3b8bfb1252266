"""Pydantic models of the OpenAI request bodies this server accepts.

The fields that change what is generated are modelled (plus vLLM's extensions `top_k`,
`repetition_penalty`, `min_tokens`, `stop_token_ids`, `ignore_eos`). A field OpenAI defines that
this server cannot honour is modelled too, so the route can refuse it by name
(handler/api/openai.py `UNSUPPORTED`); any other field (`user`, `store`, `metadata`, ...) is
kept in `model_extra`, logged once and ignored, as the OpenAI API reference allows.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from handler.api.common import Lenient
from handler.api.tool_schemas import MessageToolCall, Tool, ToolChoice


class StreamOptions(Lenient):
    include_usage: StrictBool = False


Number = StrictFloat | StrictInt


class JsonSchemaFormat(Lenient):
    """`response_format.json_schema`: `schema` is what the output must validate against (always
    enforced: `strict` is accepted and changes nothing)."""

    name: StrictStr = Field(min_length=1)
    schema_: Any = Field(default=None, alias="schema")
    strict: StrictBool | None = None
    description: StrictStr | None = None


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class _Common(Lenient):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: StrictStr | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | StrictInt | None = Field(default=None, ge=0, le=2)
    top_p: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=1)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, lt=2**63)
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    n: StrictInt | None = Field(default=1, ge=1)
    ignore_eos: StrictBool | None = None
    presence_penalty: Number | None = None
    frequency_penalty: Number | None = None
    logit_bias: dict[StrictStr, Number] | None = None
    response_format: ResponseFormat | None = None
    # vLLM's extensions, which OpenAI clients send through `extra_body`.
    top_k: StrictInt | None = Field(default=None, ge=-1, lt=2**31)  # an int32 on every sampler
    repetition_penalty: Number | None = Field(default=None, gt=0)
    min_tokens: StrictInt | None = Field(default=None, ge=0)
    stop_token_ids: list[StrictInt] | None = None


class CompletionRequest(_Common):
    """`POST /v1/completions`: a prompt is a string, token ids, or a list holding one of either
    (more than one prompt per request is refused by the route)."""

    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    echo: StrictBool | None = None
    best_of: StrictInt | None = None
    suffix: StrictStr | None = None
    # OpenAI's legacy logprobs: the chosen token's and up to 5 alternatives per position.
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)


class TextPart(Lenient):
    type: Literal["text"]
    text: StrictStr


class ChatMessage(Lenient):
    role: StrictStr = Field(min_length=1)
    content: StrictStr | list[TextPart] | None = None
    name: StrictStr | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls
    tool_call_id: StrictStr | None = None  # a `tool` message: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)

    def template_message(self) -> dict[str, Any]:
        """As chat templates expect it: text content; `name`, `tool_calls` and `tool_call_id` only
        when given (templates test `'tool_calls' in message`)."""
        out: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [call.template_dict() for call in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class ChatCompletionRequest(_Common):
    """`POST /v1/chat/completions`."""

    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages as chat templates expect them (see `ChatMessage.template_message`)."""
        return [m.template_message() for m in self.messages]
