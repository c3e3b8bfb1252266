"""OpenAI's Responses API: `POST /v1/responses` (one turn, streamed as OpenAI's events or whole),
`GET /v1/responses/{id}`, `GET /v1/responses/{id}/input_items` and `DELETE /v1/responses/{id}`.

It shares the chat route's machinery: the chat template (handler/api/chat_template.py), the tool
setup and the family's tool-call parser (handler/api/tool_schemas.py, tool_parsers/), the JSON
Schema constraint. What is its own: the input items (conversation.py), the output items and their
events (output.py), and the state: with `store` (OpenAI's default: true) the response, its input
items and the conversation so far are kept in the worker's `ResponseStore`, so that
`previous_response_id` continues it.

Custom tools (`{"type": "custom", "name", "format"}`) take free-form text. Offered alongside
other tools, a custom tool is a function of one string, `input`, to the model, and its calls come
back as `custom_tool_call` items. Forced (`tool_choice: {"type": "custom", "name"}`), the whole
output is its input, constrained by its grammar (`format: {"type": "grammar", "syntax": "lark" |
"regex", "definition"}`) when it has one.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

from handler.api.base import Api
from handler.api.chat_template import render_chat
from handler.api.common import checked_max_new_tokens, compact_json, json_schema_constraint, served_model, validated
from handler.api.openai import JSON, SSE, error_body
from handler.api.responses.conversation import CUSTOM_INPUT, input_messages, new_id, output_messages
from handler.api.responses.output import Events, OutputStream
from handler.api.responses.schemas import (
    MAX_METADATA,
    MAX_METADATA_KEY,
    MAX_METADATA_VALUE,
    CustomTool,
    FunctionTool,
    GrammarFormat,
    HostedTool,
    JsonSchemaText,
    NamedTool,
    OtherToolChoice,
    ResponsesRequest,
)
from handler.api.responses.store import ResponseStore, StoredResponse
from handler.api.tool_parsers import DEFAULT_TOOL_PARSER
from handler.api.tool_schemas import FunctionDefinition, FunctionName, NamedToolChoice, Tool, ToolSetup, tool_setup
from handler.engine.sequence import FinishReason, Sequence
from handler.errors import InvalidRequest, NotFound, ServingError
from handler.request import Constraint, GenerationRequest, Limits, SamplingParams

INPUT_ITEMS = "input_items"  # GET /v1/responses/{id}/input_items
# OpenAI's fields this server cannot honour: a 400 naming the field unless the value is neutral.
REFUSED: dict[str, str] = {
    "background": "background responses are not served: send the request and keep the connection (stream: true)",
    "include": "no extra output (logprobs, reasoning, sources) is served",
    "top_logprobs": "logprobs are not served on this route",
    "max_tool_calls": "the number of tool calls is not capped",
    "prompt": "stored prompt templates are not served: send the input",
    "conversation": "conversations are not served: use previous_response_id or send the whole input",
}
NEUTRAL: dict[str, tuple[Any, ...]] = {"background": (False,), "include": ([],), "top_logprobs": (0,)}


class ResponsesApi(Api):
    name = "openai.responses"

    STATUS: ClassVar[dict[FinishReason, str]] = {
        FinishReason.EOS: "completed",
        FinishReason.STOP: "completed",
        FinishReason.LENGTH: "incomplete",
    }

    def __init__(
        self,
        model_name: str,
        responses: ResponseStore | None,
        tool_parser: str = DEFAULT_TOOL_PARSER,
        model_id: str | None = None,
        method: str = "POST",
    ) -> None:
        self.model = model_name
        self.store = responses
        self.tool_parser = tool_parser
        self.target = model_id  # `<id>` or `<id>/input_items` of the GET and DELETE routes
        self.method = method
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.events = Events()
        self.output: OutputStream | None = None
        self.settings: dict[str, Any] = {}  # the request's settings, echoed in the response object
        self.stored = True
        self.conversation: list[dict[str, Any]] = []  # the turns before this output (for the store)
        self.input_items: list[dict[str, Any]] = []
        self.constraint_param = "text.format"
        self._head_sent = False

    # -- GET and DELETE ------------------------------------------------------------------------
    def immediate(self, limits: Limits | None = None) -> str | None:
        if self.target is None:
            if self.method != "POST":
                raise InvalidRequest("listing responses is not served: GET /v1/responses/{id}", "url_path")
            return None
        store = self._store()
        response_id, _, sub = self.target.partition("/")
        if sub not in ("", INPUT_ITEMS):
            raise NotFound(f"no route v1/responses/{self.target}", "url_path")
        if self.method == "DELETE":
            if sub:
                raise InvalidRequest("only a whole response is deleted: DELETE /v1/responses/{id}", "url_path")
            store.delete(response_id, param="response_id")
            return compact_json({"id": response_id, "object": "response", "deleted": True})
        stored = store.get(response_id, param="response_id")
        if sub == INPUT_ITEMS:
            items = list(stored.input_items)
            return compact_json(
                {
                    "object": "list",
                    "data": items,
                    "first_id": items[0]["id"] if items else None,
                    "last_id": items[-1]["id"] if items else None,
                    "has_more": False,
                }
            )
        return compact_json(stored.response)

    def _store(self, param: str = "response_id") -> ResponseStore:
        if self.store is None:
            raise NotFound("this server stores no responses (handler.responses.store_mb: 0)", param)
        return self.store

    # -- POST: the request ---------------------------------------------------------------------
    def parse(self, body: dict[str, Any] | str, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        if isinstance(body, str):
            raise InvalidRequest("the request body must be a JSON object", "body")
        req = validated(ResponsesRequest, body)
        self._refuse(req, body)
        self.model, adapter = served_model(req.model, self.model, True, limits.adapters)
        self.stored = req.store is not False
        before = self._previous(req.previous_response_id)
        messages, self.input_items = input_messages(req.input)
        if not messages and not before:
            raise InvalidRequest("'input' is required: a string or a list of items", "input")
        self.conversation = before + messages
        instructions = [{"role": "system", "content": req.instructions}] if req.instructions else []
        tools, forced_custom, grammar = self._tools(req)
        prompt = render_chat(tokenizer, instructions + self.conversation, tools.template_tools() if tools else None)
        constraint = self._constraint(req, tools, forced_custom, grammar)
        parser = (
            tools.parser(self.tool_parser) if tools is not None and tools.parses_calls and not forced_custom else None
        )
        custom = frozenset(t.name for t in req.tools or () if isinstance(t, CustomTool))
        self.output = OutputStream(self.events, parser, custom, forced_custom)
        self._echo(req, body)
        return GenerationRequest(
            prompt=prompt,
            max_new_tokens=checked_max_new_tokens(req.max_output_tokens, limits, "max_output_tokens"),
            sampling=_sampling(req),
            stream=bool(req.stream),
            ignore_eos=bool(req.ignore_eos),
            add_special_tokens=False,
            constraint=constraint,
            adapter=adapter,
        )

    def wire_name(self, field: str) -> str:
        names = {"max_new_tokens": "max_output_tokens", "prompt": "input", "constraint": self.constraint_param}
        return names.get(field, field)

    def _refuse(self, req: ResponsesRequest, body: dict[str, Any]) -> None:
        for field, why in REFUSED.items():
            value = body.get(field)
            if value is not None and value not in NEUTRAL.get(field, ()):
                raise InvalidRequest(f"'{field}' is not supported: {why}", field)
        if req.reasoning is not None and (
            req.reasoning.effort or req.reasoning.summary or req.reasoning.generate_summary
        ):
            raise InvalidRequest(
                "'reasoning' is not supported: this model does not reason in a separate channel", "reasoning"
            )
        if req.truncation not in (None, "disabled"):
            raise InvalidRequest(
                "'truncation' 'auto' is not served: a conversation longer than the model's context is refused, "
                "never cut",
                "truncation",
            )
        for i, tool in enumerate(req.tools or ()):
            if isinstance(tool, HostedTool):
                raise InvalidRequest(
                    f"'tools[{i}].type': {tool.type!r} tools are not served (function and custom tools are)",
                    f"tools[{i}].type",
                )
        if isinstance(req.tool_choice, OtherToolChoice):
            raise InvalidRequest(
                f"'tool_choice' of type {req.tool_choice.type!r} is not served (auto, none, required, or a named "
                "function or custom tool)",
                "tool_choice",
            )
        metadata = req.metadata or {}
        if len(metadata) > MAX_METADATA:
            raise InvalidRequest(f"'metadata' holds at most {MAX_METADATA} pairs, got {len(metadata)}", "metadata")
        for key, value in metadata.items():
            if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
                raise InvalidRequest(
                    f"'metadata': keys up to {MAX_METADATA_KEY} characters, values up to {MAX_METADATA_VALUE}",
                    "metadata",
                )

    def _previous(self, response_id: str | None) -> list[dict[str, Any]]:
        """The conversation a `previous_response_id` continues (404 naming it when not stored here)."""
        if response_id is None:
            return []
        stored = self._store("previous_response_id").get(response_id, param="previous_response_id")
        return [dict(m) for m in stored.conversation]

    def _tools(self, req: ResponsesRequest) -> tuple[ToolSetup | None, str | None, GrammarFormat | None]:
        """The tools as the chat route takes them (a custom tool as a function of one string), the
        custom tool `tool_choice` forces, and its grammar."""
        as_functions = [_as_function(tool) for tool in req.tools or () if not isinstance(tool, HostedTool)]
        choice: Any = req.tool_choice
        forced_custom, grammar = None, None
        if isinstance(choice, NamedTool):
            named = next((t for t in req.tools or () if getattr(t, "name", None) == choice.name), None)
            if named is None or named.type != choice.type:
                raise InvalidRequest(
                    f"tool_choice names the {choice.type} tool '{choice.name}', which is not in 'tools'", "tool_choice"
                )
            if isinstance(named, CustomTool):
                forced_custom = named.name
                grammar = named.format if isinstance(named.format, GrammarFormat) else None
                choice = "none"  # its input is the whole output: no call syntax to parse
            else:
                choice = NamedToolChoice(type="function", function=FunctionName(name=choice.name))
        setup = tool_setup(as_functions, choice, req.parallel_tool_calls)
        return setup, forced_custom, grammar

    def _constraint(
        self, req: ResponsesRequest, tools: ToolSetup | None, forced_custom: str | None, grammar: GrammarFormat | None
    ) -> Constraint | None:
        if forced_custom is not None:
            if grammar is None:
                return None
            index = next(i for i, t in enumerate(req.tools or ()) if getattr(t, "name", None) == forced_custom)
            self.constraint_param = f"tools[{index}].format.definition"
            return Constraint(grammar.syntax, grammar.definition)
        constraint = tools.constraint(self.tool_parser) if tools is not None else None
        if constraint is not None:
            self.constraint_param = "tools"
            return constraint
        fmt = req.text.format if req.text is not None else None
        if fmt is None or fmt.type == "text":
            return None
        if isinstance(fmt, JsonSchemaText):
            self.constraint_param = "text.format.schema"
            if fmt.schema_ is None:
                raise InvalidRequest("'text.format.schema' is required with type json_schema", self.constraint_param)
            return json_schema_constraint(fmt.schema_, self.constraint_param)
        return Constraint("json_object")

    def _echo(self, req: ResponsesRequest, body: dict[str, Any]) -> None:
        """The request's settings as OpenAI's response object repeats them."""
        text = body.get("text") if isinstance(body.get("text"), dict) else None
        self.settings = {
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls is not False,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": None, "summary": None},
            "store": self.stored,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": (text or {}).get("format") or {"type": "text"}},
            "tool_choice": body.get("tool_choice") or "auto",
            "tools": body.get("tools") or [],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "user": req.user,
            "background": False,
            "service_tier": "default",
        }

    # -- POST: the response --------------------------------------------------------------------
    def content_type(self, request: GenerationRequest) -> str:
        return SSE if request.stream else JSON

    def chunk(self, sequence: Sequence, delta: str) -> str:
        assert self.output is not None
        return self._head() + self.output.feed(delta)

    def final(self, sequence: Sequence) -> str:
        assert self.output is not None
        status = self.STATUS[sequence.finish_reason] if sequence.finish_reason is not None else "completed"
        if sequence.request.stream:
            head = self._head()
        else:
            head = ""
            self.output.feed(sequence.full_text)  # the same items as streamed, the events dropped
        tail = self.output.end(status)
        response = self._response(sequence, status)
        if self.stored and self.store is not None:
            conversation = self.conversation + output_messages(self.output.items)
            self.store.put(self.id, StoredResponse(response, tuple(self.input_items), tuple(conversation)))
        if not sequence.request.stream:
            return compact_json(response)
        return head + tail + self.events(f"response.{status}", response=response)

    def error(self, error: ServingError, midstream: bool) -> str:
        if not midstream:
            return compact_json(error_body(error))
        failed = self._object("failed", self.output.items if self.output is not None else [], None)
        wire = error_body(error)["error"]
        failed["error"] = {"code": wire["code"] or wire["type"], "message": wire["message"]}
        head = "" if self._head_sent else self._lifecycle(self._object("in_progress", [], None))
        return head + self.events("response.failed", response=failed)

    def _head(self) -> str:
        """`response.created` and `response.in_progress`, once, before the first item."""
        if self._head_sent:
            return ""
        return self._lifecycle(self._object("in_progress", [], None))

    def _lifecycle(self, response: dict[str, Any]) -> str:
        self._head_sent = True
        return self.events("response.created", response=response) + self.events(
            "response.in_progress", response=response
        )

    def _response(self, sequence: Sequence, status: str) -> dict[str, Any]:
        assert self.output is not None
        prompt, completion = len(sequence.prompt_ids), sequence.completion_tokens
        usage = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        response = self._object(status, self.output.items, usage)
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        return response

    def _object(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self.settings,
        }


def _as_function(tool: FunctionTool | CustomTool) -> Tool:
    """A Responses tool as the chat route's `Tool`; a custom tool as a function of one string."""
    if isinstance(tool, FunctionTool):
        parameters = tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        definition = FunctionDefinition(
            name=tool.name, description=tool.description, parameters=parameters, strict=tool.strict
        )
    else:
        parameters = {
            "type": "object",
            "properties": {CUSTOM_INPUT: {"type": "string"}},
            "required": [CUSTOM_INPUT],
            "additionalProperties": False,
        }
        description = (tool.description or "") + " (free-form text input)"
        definition = FunctionDefinition(name=tool.name, description=description.strip(), parameters=parameters)
    return Tool(type="function", function=definition)


def _sampling(req: ResponsesRequest) -> SamplingParams:
    """As the other OpenAI routes: temperature 1 (sampling) by default, 0 is greedy; vLLM's `top_k`."""
    temperature = 1.0 if req.temperature is None else float(req.temperature)
    top_p = 1.0 if req.top_p is None else float(req.top_p)
    return SamplingParams(
        do_sample=temperature > 0, temperature=temperature, top_p=top_p, top_k=max(req.top_k or 0, 0), seed=req.seed
    )
