"""Pydantic models of the Text Generation Inference (TGI) request body:
`{"inputs": str, "parameters": {...}, "stream": bool}`.

Only types are checked here; the ranges are checked in `handler.api.tgi` so the messages
read like TGI's ("`temperature` must be strictly positive"). Unknown fields are kept in
`model_extra`, logged and ignored, as TGI's router does.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictFloat, StrictInt, StrictStr

from handler.api.common import Lenient

Number = StrictFloat | StrictInt


class TgiParameters(Lenient):
    """TGI's `GenerateParameters` (router lib.rs), plus `ignore_eos` (this server's extension)."""

    best_of: StrictInt | None = None
    decoder_input_details: StrictBool | None = None
    details: StrictBool | None = None
    do_sample: StrictBool | None = None
    frequency_penalty: Number | None = None
    grammar: Any = None
    adapter_id: StrictStr | None = None
    max_new_tokens: StrictInt | None = None
    repetition_penalty: Number | None = None
    return_full_text: StrictBool | None = None
    seed: StrictInt | None = None
    stop: StrictStr | list[StrictStr] | None = None
    temperature: Number | None = None
    top_k: StrictInt | None = Field(default=None, lt=2**31)  # an int32 on every sampler
    top_n_tokens: StrictInt | None = None
    top_p: Number | None = None
    truncate: StrictInt | None = None
    typical_p: Number | None = None
    watermark: StrictBool | None = None
    ignore_eos: StrictBool | None = None


class TgiRequest(Lenient):
    """TGI's `GenerateRequest` (and `CompatGenerateRequest`, which adds `stream`)."""

    inputs: StrictStr
    parameters: TgiParameters = TgiParameters()
    stream: StrictBool | None = None
