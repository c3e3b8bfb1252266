"""OpenAI-compatible routes: `v1/completions`, `v1/chat/completions` and `v1/models`.

TorchServe passes the path after `/predictions/<model>/<version>/` as the `url_path`
request header, so an OpenAI client pointed at
`http://host:8080/predictions/<model>/1.0/v1` reaches these classes unchanged.

Streaming answers are server-sent events: one `data: {json}\\n\\n` per piece of text,
a last chunk carrying `finish_reason`, a usage chunk (empty `choices`) when
`stream_options.include_usage` is set, then `data: [DONE]\\n\\n`. An error after the
first event is sent in-band as a `data: {"error": ...}` event followed by `[DONE]`.

One instance serves one request (`select_api` builds a fresh one), so the id, the
`created` time and whether the first chunk went out live on the instance.
"""

from __future__ import annotations

import logging
import time
from abc import abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel

from handler.api.base import Api
from handler.api.chat_template import render_chat
from handler.api.common import (
    N_MAX,
    checked_max_new_tokens,
    compact_json,
    extra_fields,
    json_schema_constraint,
    log_ignored,
    output_shaping,
    served_model,
    sse,
    stop_strings,
    validated,
)
from handler.api.logprobs import RenderedToken, TokenLog, as_bytes
from handler.api.openai_schemas import ChatCompletionRequest, CompletionRequest
from handler.api.tool_parsers import (
    DEFAULT_TOOL_PARSER,
    ArgumentsPiece,
    CallStart,
    Piece,
    TextPiece,
    ToolCallStream,
    ToolParser,
)
from handler.api.tool_schemas import ToolSetup, tool_setup
from handler.engine.sequence import FinishReason, Sequence
from handler.errors import InvalidRequest, NotFound, ServingError, to_http
from handler.request import Constraint, GenerationRequest, Limits, SamplingParams

logger = logging.getLogger(__name__)

SSE = "text/event-stream"
JSON = "application/json"
DONE = "data: [DONE]\n\n"
OWNER = "inf2-llm-serving"

_FINISH_REASONS = {FinishReason.EOS: "stop", FinishReason.STOP: "stop", FinishReason.LENGTH: "length"}
# The service checks lengths and logprobs with the domain's names; OpenAI clients read their own.
_PARAM_NAMES = {"max_new_tokens": "max_tokens", "prompt_logprobs": "echo"}


def error_body(error: ServingError) -> dict[str, Any]:
    """The OpenAI error object: {"error": {"message", "type", "param", "code"}}."""
    body = to_http(error).body
    inner = dict(body["error"])
    inner["code"] = error.code
    return {"error": inner}


def usage(sequences: list[Sequence]) -> dict[str, int]:
    """One prompt, however many outputs (`n`) were generated for it."""
    prompt, completion = len(sequences[0].prompt_ids), sum(s.completion_tokens for s in sequences)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _OpenAIGeneration(Api):
    """What completions and chat completions share; subclasses say how a prompt is built
    and how a choice looks."""

    schema: ClassVar[type[BaseModel]]
    id_prefix: ClassVar[str]
    object_name: ClassVar[str]
    chunk_object_name: ClassVar[str]
    prompt_param: ClassVar[str]  # the field an empty prompt is blamed on

    def __init__(self, model_name: str, named_route: bool = False) -> None:
        self.model = model_name
        self.named_route = named_route  # reached by its route's name: the body's `model` must be the served one
        self.created = int(time.time())
        self.include_usage = False
        self._started: set[int] = set()  # choice indices whose first chunk went out
        self._token_logs: dict[int, TokenLog] = {}
        self.constraint_param = "response_format"

    # -- request -----------------------------------------------------------------
    def parse(self, body: dict[str, Any] | str, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        if isinstance(body, str):
            raise InvalidRequest("the request body must be a JSON object", "body")
        req = validated(self.schema, body)
        log_ignored(self.name, [f for f in extra_fields(req) if f not in self.unsupported])
        self._refuse_unsupported(req, body)
        n = req.n or 1
        if n > N_MAX:
            raise InvalidRequest(f"n must be between 1 and {N_MAX}, got {n}", "n")
        self.model, adapter = served_model(req.model, self.model, self.named_route, limits.adapters)
        self.include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
        prompt, add_special_tokens, token_ids = self._prompt(req, tokenizer)
        if token_ids is None and not prompt.strip():
            raise InvalidRequest("the prompt is empty", self.prompt_param)
        logprobs, prompt_logprobs = self._logprobs(req)
        return GenerationRequest(
            prompt=prompt,
            max_new_tokens=_max_tokens(req, limits),
            sampling=_sampling(req),
            stop=stop_strings(req.stop, limits),
            stream=bool(req.stream),
            ignore_eos=bool(req.ignore_eos),
            add_special_tokens=add_special_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            prompt_token_ids=token_ids,
            stop_token_ids=tuple(req.stop_token_ids or ()),
            constraint=self._constraint(req),
            n=n,
            adapter=adapter,
        )

    # Fields OpenAI defines that this route cannot honour: a 400 naming them, never silently dropped.
    # Each maps to the reason; a field is refused when present with a value other than its neutral one.
    unsupported: ClassVar[dict[str, str]] = {}

    def _refuse_unsupported(self, req: Any, body: dict[str, Any]) -> None:
        for field, why in self.unsupported.items():
            value = body.get(field)
            if value is not None and not _neutral(field, value):
                raise InvalidRequest(f"'{field}' is not supported: {why}", field)

    def _constraint(self, req: Any) -> Constraint | None:
        """The output's constraint from `response_format`; `constraint_param` names the field a
        schema problem is blamed on."""
        fmt = req.response_format
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            self.constraint_param = "response_format"
            return Constraint("json_object")
        self.constraint_param = "response_format.json_schema.schema"
        if fmt.json_schema is None:
            raise InvalidRequest(
                "response_format.json_schema is required with type json_schema", "response_format.json_schema"
            )
        if fmt.json_schema.schema_ is None:
            raise InvalidRequest("response_format.json_schema.schema is required", self.constraint_param)
        return json_schema_constraint(fmt.json_schema.schema_, self.constraint_param)

    @abstractmethod
    def _prompt(self, req: Any, tokenizer: Any) -> tuple[str, bool, tuple[int, ...] | None]:
        """The prompt text, whether tokenizing it should add the special tokens, and the prompt's
        token ids when the client sent ids (the service decodes them into the text)."""

    @abstractmethod
    def _logprobs(self, req: Any) -> tuple[int | None, bool]:
        """The request's `logprobs` (None: none) and whether it wants the prompt's too."""

    def wire_name(self, field: str) -> str:
        if field == "constraint":
            return self.constraint_param
        return _PARAM_NAMES.get(field, field)

    def content_type(self, request: GenerationRequest) -> str:
        return SSE if request.stream else JSON

    # -- response ----------------------------------------------------------------
    def _envelope(self, sequence: Sequence, object_name: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": f"{self.id_prefix}-{sequence.response_id}",
            "object": object_name,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _event(self, sequence: Sequence, choice: dict[str, Any]) -> str:
        body = self._envelope(sequence, self.chunk_object_name, [choice])
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    @abstractmethod
    def _stream_choice(self, sequence: Sequence, text: str, finish_reason: str | None) -> dict[str, Any]: ...

    @abstractmethod
    def _whole_choice(self, sequence: Sequence, text: str, finish_reason: str) -> dict[str, Any]: ...

    @property
    def started(self) -> bool:
        """Some chunk went out (an error now goes in-band)."""
        return bool(self._started)

    def choice_started(self, sequence: Sequence) -> bool:
        return sequence.choice_index in self._started

    def tokens(self, sequence: Sequence) -> TokenLog:
        """The logprobs already sent for this choice."""
        return self._token_logs.setdefault(sequence.choice_index, TokenLog())

    def chunk(self, sequence: Sequence, delta: str) -> str:
        event = self._event(sequence, self._stream_choice(sequence, delta, None))
        self._started.add(sequence.choice_index)
        return event

    def final(self, sequence: Sequence) -> str:
        if not sequence.request.stream:
            return self.close([sequence])
        return self.finish(sequence) + self.close([sequence])

    def finish(self, sequence: Sequence) -> str:
        """Streaming: the chunk that ends one choice (its finish_reason)."""
        event = self._event(sequence, self._stream_choice(sequence, "", _FINISH_REASONS[sequence.finish_reason]))
        self._started.add(sequence.choice_index)
        return event

    def close(self, sequences: list[Sequence]) -> str:
        """Once every choice ended. Streaming: the usage chunk (when asked) and `[DONE]`.
        Non-streaming: the whole body, one choice per sequence."""
        first = sequences[0]
        if not first.request.stream:
            choices = [self._whole_choice(s, s.full_text, _FINISH_REASONS[s.finish_reason]) for s in sequences]
            body = self._envelope(first, self.object_name, choices)
            body["usage"] = usage(sequences)
            return compact_json(body)
        out = ""
        if self.include_usage:
            body = self._envelope(first, self.chunk_object_name, [])
            body["usage"] = usage(sequences)
            out += sse(body)
        return out + DONE

    def error(self, error: ServingError, midstream: bool) -> str:
        body = error_body(error)
        return sse(body) + DONE if midstream else compact_json(body)


class CompletionsApi(_OpenAIGeneration):
    name = "openai.completions"
    schema = CompletionRequest
    id_prefix = "cmpl"
    object_name = "text_completion"
    chunk_object_name = "text_completion"
    prompt_param = "prompt"
    unsupported: ClassVar[dict[str, str]] = {
        "best_of": "only best_of=1; ask for n outputs instead",
        "suffix": "this server does not insert text (no fill-in-the-middle)",
    }

    def __init__(self, model_name: str, named_route: bool = False) -> None:
        super().__init__(model_name, named_route)
        self.echo = False

    def _prompt(self, req: CompletionRequest, tokenizer: Any) -> tuple[str, bool, tuple[int, ...] | None]:
        self.echo = bool(req.echo)
        prompt: Any = req.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise InvalidRequest(
                    f"only one prompt per request is supported, got {len(prompt)}; send them as separate requests",
                    "prompt",
                )
            prompt = prompt[0]
        if isinstance(prompt, list):  # token ids
            if not prompt:
                raise InvalidRequest("the prompt has no token ids", "prompt")
            return "", False, tuple(prompt)
        return prompt, True, None

    def _logprobs(self, req: CompletionRequest) -> tuple[int | None, bool]:
        return req.logprobs, bool(req.echo) and req.logprobs is not None

    def _text(self, sequence: Sequence, text: str, first: bool) -> str:
        """The choice's text: with echo, the first piece starts with the prompt."""
        return sequence.request.prompt + text if self.echo and first else text

    def _legacy_logprobs(self, sequence: Sequence, sent: int | None) -> dict[str, Any] | None:
        if sequence.request.logprobs is None:
            return None
        echo_offset = len(sequence.request.prompt) if self.echo else 0
        tokens = self.tokens(sequence).take(sequence, text_sent=sent, with_prompt=self.echo, echo_offset=echo_offset)
        return legacy_logprobs(tokens)

    def _stream_choice(self, sequence: Sequence, text: str, finish_reason: str | None) -> dict[str, Any]:
        text = self._text(sequence, text, not self.choice_started(sequence))
        sent = self.tokens(sequence).sent(text)
        logprobs = self._legacy_logprobs(sequence, None if finish_reason is not None else sent)
        return {"index": sequence.choice_index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def _whole_choice(self, sequence: Sequence, text: str, finish_reason: str) -> dict[str, Any]:
        text = self._text(sequence, text, True)
        logprobs = self._legacy_logprobs(sequence, None)
        return {"index": sequence.choice_index, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}


class ChatCompletionsApi(_OpenAIGeneration):
    name = "openai.chat"
    schema = ChatCompletionRequest
    id_prefix = "chatcmpl"
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"
    prompt_param = "messages"
    unsupported: ClassVar[dict[str, str]] = {
        "audio": "this server generates text only",
        "modalities": "this server generates text only",
        "prediction": "predicted outputs are not supported",
        "web_search_options": "this server has no web search",
        "functions": "the deprecated functions field is not supported; send tools",
        "function_call": "the deprecated function_call field is not supported; send tool_choice",
    }

    def __init__(self, model_name: str, tool_parser: str = DEFAULT_TOOL_PARSER, named_route: bool = False) -> None:
        super().__init__(model_name, named_route)
        self.tool_parser = tool_parser  # the model family's tool-call format (handler/api/tool_parsers)
        self.tools: ToolSetup | None = None
        self._parser: ToolParser | None = None  # set when the output may hold tool calls
        self._tool_streams: dict[int, ToolCallStream] = {}  # per choice index
        self._called: set[int] = set()  # choice indices that sent a tool call

    def _prompt(self, req: ChatCompletionRequest, tokenizer: Any) -> tuple[str, bool, tuple[int, ...] | None]:
        self.tools = tool_setup(req.tools, req.tool_choice, req.parallel_tool_calls)
        if self.tools is not None and self.tools.parses_calls:
            self._parser = self.tools.parser(self.tool_parser)
        tools = self.tools.template_tools() if self.tools is not None else None
        return render_chat(tokenizer, req.template_messages(), tools), False, None

    def _constraint(self, req: ChatCompletionRequest) -> Constraint | None:
        """tool_choice "required" or a named function: the output is that format's calls (and
        response_format, which shapes content, has no content to shape)."""
        constraint = self.tools.constraint(self.tool_parser) if self.tools is not None else None
        if constraint is None:
            return super()._constraint(req)
        self.constraint_param = "tools"
        return constraint

    def _logprobs(self, req: ChatCompletionRequest) -> tuple[int | None, bool]:
        if req.top_logprobs is not None and not req.logprobs:
            raise InvalidRequest("top_logprobs needs logprobs: true", "top_logprobs")
        return (req.top_logprobs or 0) if req.logprobs else None, False

    def _chat_logprobs(self, sequence: Sequence, sent: int | None) -> dict[str, Any] | None:
        if sequence.request.logprobs is None:
            return None
        tokens = self.tokens(sequence).take(sequence, text_sent=sent, with_prompt=False, include_chosen=False)
        ends_at_eos = not sequence.request.ignore_eos
        content = [
            chat_token(t) for t in tokens if not (ends_at_eos and t.token_id in sequence.eos_token_ids)
        ]  # the message holds no end-of-sequence token, so its logprobs do not either
        return {"content": content}

    def chunk(self, sequence: Sequence, delta: str) -> str:
        if self._parser is None:
            return self._open_earlier(sequence) + super().chunk(sequence, delta)
        return self._pieces(sequence, self._tool_stream(sequence).feed(delta))

    def finish(self, sequence: Sequence) -> str:
        held = "" if self._parser is None else self._pieces(sequence, self._tool_stream(sequence).end())
        return self._open_earlier(sequence) + held + super().finish(sequence)

    def _open_earlier(self, sequence: Sequence) -> str:
        """Role chunks for the choices before this one that sent nothing yet. The official client's
        stream accumulator takes choices in the order they first appear (a first chunk for choice 1
        before any for choice 0 breaks it), and a choice holding back a possible tool call would
        otherwise let a later one go first."""
        out = ""
        for index in range(sequence.choice_index):
            if index not in self._started:
                opening = {"index": index, "delta": {"role": "assistant"}, "logprobs": None, "finish_reason": None}
                out += self._event(sequence, opening)
                self._started.add(index)
        return out

    def _tool_stream(self, sequence: Sequence) -> ToolCallStream:
        stream = self._tool_streams.get(sequence.choice_index)
        if stream is None:
            assert self._parser is not None
            stream = self._tool_streams[sequence.choice_index] = self._parser.stream()
        return stream

    def _pieces(self, sequence: Sequence, pieces: list[Piece]) -> str:
        """Streamed events for parsed output: content as usual, tool calls as `_call_event`."""
        out = self._open_earlier(sequence) if pieces else ""
        for piece in pieces:
            if isinstance(piece, TextPiece):
                out += super().chunk(sequence, piece.text)
            else:
                out += self._call_event(sequence, piece)
        return out

    def _call_event(self, sequence: Sequence, piece: CallStart | ArgumentsPiece) -> str:
        """A tool call as OpenAI streams one: a chunk with its id and name (arguments ""), then
        chunks with its arguments as the model writes them."""
        index = sequence.choice_index
        sent = self.tokens(sequence).sent(piece.raw)
        call: dict[str, Any]
        if isinstance(piece, CallStart):
            function = {"name": piece.name, "arguments": ""}
            call = {"index": piece.index, "id": piece.id, "type": "function", "function": function}
            self._called.add(index)
        elif piece.text:
            call = {"index": piece.index, "function": {"arguments": piece.text}}
        else:
            return ""  # only the call's own syntax: its tokens' logprobs go with the next chunk
        delta: dict[str, Any] = {"tool_calls": [call]}
        if not self.choice_started(sequence):
            delta = {"role": "assistant", "content": None, **delta}
        logprobs = self._chat_logprobs(sequence, sent)
        self._started.add(index)
        return self._event(sequence, {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None})

    def _stream_choice(self, sequence: Sequence, text: str, finish_reason: str | None) -> dict[str, Any]:
        if finish_reason == "stop" and sequence.choice_index in self._called:
            finish_reason = "tool_calls"
        started = self.choice_started(sequence)
        delta: dict[str, Any] = {} if started else {"role": "assistant"}
        if text or not started or finish_reason is None:
            delta["content"] = text
        sent = self.tokens(sequence).sent(text)
        logprobs = self._chat_logprobs(sequence, None if finish_reason is not None else sent)
        return {"index": sequence.choice_index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def _whole_choice(self, sequence: Sequence, text: str, finish_reason: str) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if self._parser is not None:
            content, calls = self._parser.parse(text)
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": [c.wire() for c in calls]}
                finish_reason = "tool_calls" if finish_reason == "stop" else finish_reason
        logprobs = self._chat_logprobs(sequence, None)
        return {
            "index": sequence.choice_index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason,
        }


class AnsweredApi(Api):
    """A route answered without generating (`immediate`, or an adapter change), in OpenAI's error
    format; a body never becomes a generation request."""

    def parse(self, body: Any, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        raise InvalidRequest("this route generates nothing", "url_path")

    def content_type(self, request: GenerationRequest) -> str:
        return JSON

    def chunk(self, sequence: Sequence, delta: str) -> str:
        raise NotImplementedError

    def final(self, sequence: Sequence) -> str:
        raise NotImplementedError

    def error(self, error: ServingError, midstream: bool) -> str:
        return compact_json(error_body(error))


class ModelsApi(AnsweredApi):
    """`GET /v1/models` (and `/v1/models/<id>`): answered without running the model."""

    name = "openai.models"

    def __init__(self, model_name: str, model_id: str | None = None) -> None:
        self.model_name = model_name
        self.model_id = model_id

    def _card(self, name: str) -> dict[str, Any]:
        card = {"id": name, "object": "model", "created": 0, "owned_by": OWNER}
        if name != self.model_name:
            card["parent"] = self.model_name  # a LoRA adapter on the served model (vLLM's listing)
        return card

    def immediate(self, limits: Limits | None = None) -> str | None:
        names = [self.model_name, *sorted(limits.adapters if limits is not None else ())]
        if self.model_id is None:
            return compact_json({"object": "list", "data": [self._card(name) for name in names]})
        if self.model_id not in names:
            raise NotFound(f"the model '{self.model_id}' does not exist; this server has '{self.model_name}'", "model")
        return compact_json(self._card(self.model_id))


def legacy_logprobs(tokens: list[RenderedToken]) -> dict[str, Any]:
    """OpenAI's completions logprobs object. Each top_logprobs dict holds the chosen token too
    (as vLLM does), so its logprob appears in both places as the same float."""
    top: list[dict[str, float] | None] = []
    for token in tokens:
        if token.top is None:
            top.append(None)
            continue
        alternatives: dict[str, float] = {}
        for alt in token.top:
            alternatives.setdefault(alt.text, alt.logprob)
        top.append(alternatives)
    return {
        "tokens": [t.text for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": top,
        "text_offset": [t.offset for t in tokens],
    }


def chat_token(token: RenderedToken) -> dict[str, Any]:
    """One entry of chat's `logprobs.content`."""
    top = [{"token": a.text, "logprob": a.logprob, "bytes": as_bytes(a.text)} for a in token.top or ()]
    return {"token": token.text, "logprob": token.logprob, "bytes": as_bytes(token.text), "top_logprobs": top}


def _max_tokens(req: Any, limits: Limits) -> int:
    if req.max_completion_tokens is not None:
        return checked_max_new_tokens(req.max_completion_tokens, limits, "max_completion_tokens")
    return checked_max_new_tokens(req.max_tokens, limits, "max_tokens")


def _sampling(req: Any) -> SamplingParams:
    """OpenAI defaults: temperature 1 (sampling); temperature 0 is greedy. `top_k` -1 or 0 is off
    (vLLM's spelling)."""
    temperature = 1.0 if req.temperature is None else float(req.temperature)
    top_p = 1.0 if req.top_p is None else float(req.top_p)
    return SamplingParams(
        do_sample=temperature > 0,
        temperature=temperature,
        top_p=top_p,
        top_k=max(req.top_k or 0, 0),
        repetition_penalty=1.0 if req.repetition_penalty is None else float(req.repetition_penalty),
        seed=req.seed,
        **output_shaping(req),
    )


def _neutral(field: str, value: Any) -> bool:
    """A refused field sent with the value that asks for nothing (`best_of: 1`, `suffix: ""`,
    `modalities: ["text"]`, `functions: []`)."""
    if field == "best_of":
        return value == 1
    if field == "modalities":
        return value == ["text"]
    return value in ("", [], {}, False)
