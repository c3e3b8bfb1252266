"""Pydantic models of the native request bodies (`POST /predictions/<model>`): the flat form
`{"prompt", ...}` and the Hugging Face / SageMaker form `{"inputs", "parameters": {...}}`."""

from __future__ import annotations

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from handler.api.common import MAX_LOGPROBS, Lenient


class GenerationParameters(Lenient):
    """Fields shared by the flat form (a) and the `parameters` object of form (b)."""

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


class HuggingFaceRequest(Lenient):
    inputs: StrictStr
    parameters: GenerationParameters = GenerationParameters()
    stream: StrictBool | None = None
