"""Pydantic models of the native request bodies (`POST /predictions/<model>`): the flat form
`{"prompt", ...}` and the Hugging Face / SageMaker form `{"inputs", "parameters": {...}}`."""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from handler.api.common import MAX_LOGPROBS, Lenient


class GenerationParameters(Lenient):
    """Fields shared by the flat form (a) and the `parameters` object of form (b)."""

    max_new_tokens: StrictInt | None = None
    do_sample: StrictBool | None = None
    temperature: StrictFloat | StrictInt | None = None
    top_k: StrictInt | None = Field(default=None, ge=0, lt=2**31)  # an int32 on every sampler
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
    # As OpenAI's: presence / frequency penalties in [-2, 2], logit_bias {"token id": bias}.
    presence_penalty: StrictFloat | StrictInt | None = None
    frequency_penalty: StrictFloat | StrictInt | None = None
    logit_bias: dict[StrictStr, StrictFloat | StrictInt] | None = None
    min_tokens: StrictInt | None = Field(default=None, ge=0)
    stop_token_ids: list[StrictInt] | None = None
    # As TGI's: {"type": "json" | "json_schema" | "regex", "value": ...}.
    grammar: Any = None
    adapter: StrictStr | None = None  # a configured LoRA adapter's name (handler.lora.adapters)


class NativeRequest(GenerationParameters):
    prompt: StrictStr


class HuggingFaceRequest(Lenient):
    inputs: StrictStr
    parameters: GenerationParameters = GenerationParameters()
    stream: StrictBool | None = None
