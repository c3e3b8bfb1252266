"""The native route, `POST /predictions/<model>`: NDJSON streaming or one JSON body.

Three body shapes are accepted:
  (a) `{"prompt": ..., "max_new_tokens": ..., ...}`
  (b) the Hugging Face / SageMaker form `{"inputs": ..., "parameters": {...}}`
  (c) plain text, taken as the prompt.
The body decides, not the Content-Type header: SageMaker clients send plain text as
application/json, and SageMaker's toolkit may hand the body over undecoded (bytes).

Streaming: one JSON object per line; `text` fields concatenate to the completion; the
last line adds `finish_reason` and `usage`. A failure after the first line is reported
in-band as a last `{"error": ...}` line (the 200 status is already on the wire).
"""

from __future__ import annotations

import json
import math
from typing import Any

from handler.api.base import Api
from handler.api.common import (
    checked_max_new_tokens,
    dotted,
    extra_fields,
    grammar_constraint,
    log_ignored,
    named_adapter,
    output_shaping,
    stop_strings,
    validated,
)
from handler.api.logprobs import TokenLog, native_token
from handler.api.native_schemas import GenerationParameters, HuggingFaceRequest, NativeRequest
from handler.engine.sequence import Sequence
from handler.errors import InvalidRequest, ServingError, to_http
from handler.request import GenerationRequest, Limits, SamplingParams

NDJSON = "application/x-ndjson"
JSON = "application/json"


def _line(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False) + "\n"


def usage(sequence: Sequence) -> dict[str, int]:
    return {"prompt_tokens": len(sequence.prompt_ids), "completion_tokens": sequence.completion_tokens}


def _add_logprobs(log: TokenLog, body: dict[str, Any], sequence: Sequence, sent: int | None) -> None:
    """`prompt_tokens` (once, with the first line) and `tokens` (those whose text this line
    completes; the last line has the rest, EOS included), when the request asked for them."""
    request = sequence.request
    if request.logprobs is None and not request.prompt_logprobs:
        return
    tokens = log.take(sequence, text_sent=sent, with_prompt=request.prompt_logprobs)
    prompt = [native_token(t) for t in tokens if t.prompt]
    if prompt:
        body["prompt_tokens"] = prompt
    if request.logprobs is not None:
        body["tokens"] = [native_token(t) for t in tokens if not t.prompt]


def parse_request(body: dict[str, Any] | str, limits: Limits) -> GenerationRequest:
    """Validate one decoded body (`common.decode_body`); raises `InvalidRequest` naming the bad field."""
    return _build(*validated_body(body), limits)


def validated_body(body: dict[str, Any] | str) -> tuple[str, GenerationParameters, bool | None]:
    """The prompt, the generation parameters and the form (b) `stream` of one decoded body."""
    if isinstance(body, str):
        return body, GenerationParameters(), None
    if "inputs" in body:
        hf = validated(HuggingFaceRequest, body, _field_name)
        log_ignored("native", extra_fields(hf, "") + extra_fields(hf.parameters, "parameters."))
        return hf.inputs, hf.parameters, hf.stream
    native = validated(NativeRequest, body, _field_name)
    log_ignored("native", extra_fields(native))
    return native.prompt, native, None


def _field_name(path: list[Any]) -> str:
    """`parameters.<name>` in form (b), else the top-level field (a stop list's item blames `stop`)."""
    return dotted(path[:2]) if path[:1] == ["parameters"] and len(path) > 1 else dotted(path[:1])


def _build(prompt: str, params: GenerationParameters, stream: bool | None, limits: Limits) -> GenerationRequest:
    if not prompt.strip():
        raise InvalidRequest("the prompt is empty", "prompt")
    max_new_tokens = checked_max_new_tokens(params.max_new_tokens, limits, "max_new_tokens")
    if params.stream is not None:
        stream = params.stream
    return GenerationRequest(
        prompt=prompt,
        max_new_tokens=max_new_tokens,
        sampling=_sampling(params),
        stop=stop_strings(params.stop, limits),
        stream=True if stream is None else stream,
        ignore_eos=bool(params.ignore_eos),
        logprobs=params.logprobs,
        prompt_logprobs=bool(params.prompt_logprobs or params.echo),
        stop_token_ids=tuple(params.stop_token_ids or ()),
        constraint=None if params.grammar is None else grammar_constraint(params.grammar),
        adapter=named_adapter(params.adapter, limits, "adapter"),
    )


def _sampling(params: GenerationParameters) -> SamplingParams:
    temperature = 1.0 if params.temperature is None else float(params.temperature)
    if not math.isfinite(temperature) or temperature < 0:
        raise InvalidRequest(f"temperature must be a finite number >= 0, got {params.temperature}", "temperature")
    if params.repetition_penalty is not None and not math.isfinite(params.repetition_penalty):
        raise InvalidRequest("repetition_penalty must be finite", "repetition_penalty")
    if params.do_sample is not None:
        do_sample = params.do_sample
    else:  # asking for a sampling knob means asking for sampling
        do_sample = any(v is not None for v in (params.temperature, params.top_k, params.top_p))
    if temperature == 0:
        do_sample = False
    return SamplingParams(
        do_sample=do_sample,
        temperature=temperature,
        top_k=params.top_k or 0,
        top_p=1.0 if params.top_p is None else float(params.top_p),
        repetition_penalty=1.0 if params.repetition_penalty is None else float(params.repetition_penalty),
        seed=params.seed,
        **output_shaping(params),
    )


class NativeApi(Api):
    name = "native"

    def __init__(self) -> None:
        self.tokens = TokenLog()
        self.prompt_logprobs_field = "prompt_logprobs"

    def parse(self, body: Any, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        prompt, params, stream = validated_body(body)
        # The prompt's logprobs go by either name: a 400 about them names the one the body used.
        self.prompt_logprobs_field = "prompt_logprobs" if params.prompt_logprobs else "echo"
        return _build(prompt, params, stream, limits)

    def wire_name(self, field: str) -> str:
        if field == "constraint":  # the native body's constraint is TGI's `grammar` object
            return "grammar"
        return self.prompt_logprobs_field if field == "prompt_logprobs" else field

    def content_type(self, request: GenerationRequest) -> str:
        return NDJSON if request.stream else JSON

    def chunk(self, sequence: Sequence, delta: str) -> str:
        body: dict[str, Any] = {"text": delta}
        _add_logprobs(self.tokens, body, sequence, self.tokens.sent(delta))
        return _line(body)

    def final(self, sequence: Sequence) -> str:
        streaming = sequence.request.stream
        text = "" if streaming else sequence.full_text
        body: dict[str, Any] = {"text": text}
        _add_logprobs(self.tokens, body, sequence, None)
        body.update(finish_reason=sequence.finish_reason.value, usage=usage(sequence))
        return _line(body) if streaming else json.dumps(body, ensure_ascii=False)

    def error(self, error: ServingError, midstream: bool) -> str:
        body = json.dumps(to_http(error).body, ensure_ascii=False)
        return body + "\n" if midstream else body
