"""The native request protocol: body bytes in, one frozen `GenerationRequest` out.

Three body shapes are accepted on `POST /predictions/<model>`:
  (a) `{"prompt": ..., "max_new_tokens": ..., ...}`
  (b) the Hugging Face / SageMaker form `{"inputs": ..., "parameters": {...}}`
  (c) plain text, taken as the prompt.
The body decides, not the Content-Type header: SageMaker clients send plain text as
application/json, and SageMaker's toolkit may hand the body over undecoded (bytes).
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from handler.errors import InvalidRequest
from handler.request import GenerationRequest, Limits, SamplingParams

logger = logging.getLogger(__name__)

MAX_STOP_STRINGS = 4
MAX_LOGPROBS = 20


class GenerationParameters(BaseModel):
    """Fields shared by the flat form (a) and the `parameters` object of form (b)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    max_new_tokens: StrictInt | None = None
    do_sample: StrictBool | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_k: StrictInt | None = Field(default=None, ge=0)
    top_p: StrictFloat | StrictInt | None = Field(default=None, gt=0, le=1)
    repetition_penalty: StrictFloat | StrictInt | None = Field(default=None, gt=0)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = Field(default=None, ge=0, lt=2**63)
    stream: StrictBool | None = None
    ignore_eos: StrictBool | None = None
    # logprobs: the chosen token's logprob and this many alternatives per generated token;
    # prompt_logprobs (or its alias echo): each prompt token's too.
    logprobs: StrictInt | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: StrictBool | None = None
    echo: StrictBool | None = None


class NativeRequest(GenerationParameters):
    prompt: StrictStr


class HuggingFaceRequest(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    inputs: StrictStr
    parameters: GenerationParameters = GenerationParameters()
    stream: StrictBool | None = None


def decode_body(body: Any) -> dict[str, Any] | str:
    """TorchServe hands the body over as dict (decoded JSON), str, or bytes."""
    if isinstance(body, (bytes, bytearray)):
        try:
            body = bytes(body).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(f"request body is not valid UTF-8 (byte {exc.start})", "body") from None
    if isinstance(body, str):
        stripped = body.lstrip()
        if not stripped.startswith(("{", "[")):
            return body
        try:
            body = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise InvalidRequest(f"request body is not valid JSON: {exc.msg} at position {exc.pos}", "body") from None
    if not isinstance(body, dict):
        raise InvalidRequest(
            f"request body must be a JSON object or plain text, got a JSON {type(body).__name__}", "body"
        )
    return body


def parse_request(body: Any, limits: Limits) -> GenerationRequest:
    """Validate one request body; raises `InvalidRequest` naming the bad field."""
    decoded = decode_body(body)
    if isinstance(decoded, str):
        return _build(decoded, GenerationParameters(), None, limits)
    if "inputs" in decoded:
        hf = _validate(HuggingFaceRequest, decoded)
        _log_ignored(hf.parameters, prefix="parameters.")
        return _build(hf.inputs, hf.parameters, hf.stream, limits)
    native = _validate(NativeRequest, decoded)
    _log_ignored(native, prefix="")
    return _build(native.prompt, native, None, limits)


def _validate(model: type[BaseModel], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(part) for part in err["loc"]]
        param = ".".join(loc[:2]) if loc[0] == "parameters" and len(loc) > 1 else loc[0]
        if err["type"] == "missing":
            raise InvalidRequest(f"'{param}' is required", param) from None
        raise InvalidRequest(f"'{param}': {err['msg']}", param) from None


def _log_ignored(model: BaseModel, prefix: str) -> None:
    extra = sorted((model.model_extra or {}).keys())
    if extra:
        logger.info("ignoring unknown request fields: %s", ", ".join(prefix + key for key in extra))


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
        stop=stop_strings(params.stop),
        stream=True if stream is None else stream,
        ignore_eos=bool(params.ignore_eos),
        logprobs=params.logprobs,
        prompt_logprobs=bool(params.prompt_logprobs or params.echo),
        prompt_logprobs_param="prompt_logprobs" if params.prompt_logprobs else "echo",
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
    )


def checked_max_new_tokens(value: int | None, limits: Limits, param: str) -> int:
    """The request's token budget (the default when absent), within the deployment's limit."""
    if value is None:
        return limits.default_max_new_tokens
    if not 1 <= value <= limits.max_new_tokens:
        raise InvalidRequest(f"{param} must be between 1 and {limits.max_new_tokens}, got {value}", param)
    return value


def stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """Up to MAX_STOP_STRINGS non-empty stop strings."""
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop strings are allowed, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise InvalidRequest("stop strings must not be empty", "stop")
    return tuple(stops)
