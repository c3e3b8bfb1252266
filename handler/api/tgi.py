"""Text Generation Inference (TGI) wire format, as `huggingface_hub.InferenceClient.text_generation`
and the SageMaker Hugging Face LLM containers speak it.

Routes (handler/api/__init__.py): `generate` (the body's `stream` decides, like TGI's `POST /`;
non-streamed one JSON object), `generate_stream` (always SSE), and, with
`handler.no_route_api: tgi`, an `{"inputs", "parameters"}` body that names no route
(non-streamed as a one-element list, as TGI's `POST /` and the SageMaker containers answer).

Streaming: one `data:{json}\\n\\n` event per generated token,
`{"index", "token": {"id", "text", "logprob", "special"}, "generated_text": null, "details": null}`
(plus a flat `top_tokens` list with `top_n_tokens`); the last event carries `generated_text`
and, with `details`, `{"finish_reason", "generated_tokens", "seed", "input_length"}`. No
`[DONE]`. The events' token texts concatenate to exactly the generated text: each token
carries the text it completed (`Sequence.text`), so a token whose text was held back (part of
a UTF-8 character, a possible stop string) has `""` and the one that completes it carries it
all; EOS has `""` and `special: true`.

Errors: `{"error": str, "error_type": str}`; 422 `validation`, 424 `generation`, 503
`overloaded` (draining; TGI's own overload is 429, see docs/tgi.md). After the first event an
error is one more SSE event with those keys (`incomplete_generation` when a drain cut it).

One instance serves one request: it remembers which tokens' events went out.
"""

from __future__ import annotations

import logging
import math
import random
from http import HTTPStatus
from typing import Any

from handler.api.base import Api
from handler.api.common import (
    checked_max_new_tokens,
    compact_json,
    dotted,
    extra_fields,
    grammar_constraint,
    log_ignored,
    named_adapter,
    sse,
    stop_strings,
    validated,
)
from handler.api.common import penalty as penalty_value
from handler.api.tgi_schemas import TgiParameters, TgiRequest
from handler.engine.sequence import FinishReason, Sequence
from handler.errors import EngineError, InvalidRequest, ServiceUnavailable, ServingError
from handler.request import GenerationRequest, Limits, SamplingParams

logger = logging.getLogger(__name__)

SSE = "text/event-stream"
JSON = "application/json"
MAX_TOP_N_TOKENS = 5  # TGI's default --max-top-n-tokens
SEED_LIMIT = 2**63
# Named parameters.<field> in a backend's refusal.
SAMPLING_FIELDS = ("seed", "repetition_penalty", "top_k", "top_p", "temperature", "frequency_penalty", "grammar")

FINISH_REASONS = {FinishReason.EOS: "eos_token", FinishReason.LENGTH: "length", FinishReason.STOP: "stop_sequence"}


def tgi_sse(obj: dict[str, Any]) -> str:
    return sse(obj, field="data:")  # TGI writes no space after the colon


def error_type(error: ServingError, midstream: bool = False) -> str:
    if isinstance(error, ServiceUnavailable):
        return "incomplete_generation" if midstream else "overloaded"
    if isinstance(error, EngineError) or error.status >= 500:
        return "generation"
    return "validation"


def http_status(error: ServingError) -> int:
    if isinstance(error, InvalidRequest):
        return 422
    if isinstance(error, EngineError):
        return 424
    return error.status  # 503 draining, 404


def error_body(error: ServingError, midstream: bool = False) -> dict[str, str]:
    message = error.message
    if isinstance(error, InvalidRequest):
        message = f"Input validation error: {message}"
    return {"error": message, "error_type": error_type(error, midstream)}


class TgiApi(Api):
    name = "tgi"

    def __init__(self, always_stream: bool = False, as_list: bool = False) -> None:
        self.always_stream = always_stream  # generate_stream: SSE whatever the body says
        self.as_list = as_list  # non-streamed body as [ {...} ] (TGI's POST /, SageMaker)
        self.details = False
        self.prefill_details = False
        self.top_n = 0
        self.return_full_text = False
        self.seed: int | None = None
        self.sent = 0  # tokens whose event is on the wire
        self._special: frozenset[int] | None = None

    # -- request -----------------------------------------------------------------
    def parse(self, body: dict[str, Any] | str, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        if isinstance(body, str):
            raise InvalidRequest('the request body must be a JSON object {"inputs": ..., "parameters": {...}}', "body")
        req = validated(TgiRequest, body, _field_name, quote="`")
        params = req.parameters
        log_ignored("tgi", extra_fields(req) + extra_fields(params, "parameters."))
        if not req.inputs.strip():
            raise InvalidRequest("`inputs` cannot be empty", "inputs")
        stream = self.always_stream or bool(req.stream)
        _refuse_unsupported(params, stream)
        self.details = bool(params.details or params.decoder_input_details)
        self.prefill_details = bool(params.decoder_input_details)
        self.top_n = _top_n(params.top_n_tokens)
        self.return_full_text = bool(params.return_full_text)
        sampling = _sampling(params)
        self.seed = sampling.seed if sampling.do_sample else None
        # Only answers that show logprobs ask for them: a backend without logits (sim) refuses
        # requests that do, and a plain stream's events carry `"logprob": null` instead.
        wants_logprobs = self.details or self.top_n > 0
        return GenerationRequest(
            prompt=req.inputs,
            max_new_tokens=_max_new_tokens(params.max_new_tokens, limits),
            sampling=sampling,
            stop=_stop(params.stop, limits),
            stream=stream,
            ignore_eos=bool(params.ignore_eos),
            logprobs=self.top_n if wants_logprobs else None,
            prompt_logprobs=self.prefill_details,
            constraint=None if params.grammar is None else grammar_constraint(params.grammar),
            adapter=named_adapter(params.adapter_id, limits, "adapter_id"),
        )

    def content_type(self, request: GenerationRequest) -> str:
        return SSE if request.stream else JSON

    # -- response ----------------------------------------------------------------
    def chunk(self, sequence: Sequence, delta: str) -> str:
        """Events for the tokens whose text makes up `delta` (and the empty-text tokens before
        them). A finished sequence's last token is left to `final`, which must carry it."""
        texts = list(sequence.text)
        last = len(texts) - 1 if sequence.finished else None
        covered, out = 0, []
        while self.sent < len(texts) and covered < len(delta) and self.sent != last:
            covered += len(texts[self.sent])
            out.append(tgi_sse(self._stream_event(sequence, self.sent, texts[self.sent])))
            self.sent += 1
        return "".join(out)

    def final(self, sequence: Sequence) -> str:
        if not sequence.request.stream:
            body = self._whole(sequence)
            return compact_json([body] if self.as_list else body)
        texts = list(sequence.text)
        out = [tgi_sse(self._stream_event(sequence, i, texts[i])) for i in range(self.sent, len(texts) - 1)]
        last = len(texts) - 1
        event = (
            self._stream_event(sequence, last, texts[last])
            if last >= self.sent
            else {"index": len(texts) + 1, "token": {"id": 0, "text": "", "logprob": None, "special": True}}
        )
        self.sent = len(texts)
        event["generated_text"] = self._generated_text(sequence)
        if self.details:
            event["details"] = {
                "finish_reason": FINISH_REASONS[sequence.finish_reason],
                "generated_tokens": sequence.completion_tokens,
                "seed": self.seed,
                "input_length": len(sequence.prompt_ids),
            }
        out.append(tgi_sse(event))
        return "".join(out)

    def error(self, error: ServingError, midstream: bool) -> str:
        if midstream:
            return tgi_sse(error_body(error, midstream=True))
        return compact_json(error_body(error))

    def wire_name(self, field: str) -> str:
        """What a backend's refusal names (sim has no logits; neuronx needs output_all_logits; nxdi's
        on-device sampling takes no seed)."""
        if field == "logprobs":
            return "parameters.top_n_tokens" if self.top_n > 0 else "parameters.details"
        if field == "prompt_logprobs":
            return "parameters.decoder_input_details"
        if field == "constraint":
            field = "grammar"
        return f"parameters.{field}" if field in SAMPLING_FIELDS else field

    def http_status(self, error: ServingError) -> tuple[int, str]:
        status = http_status(error)
        return status, HTTPStatus(status).phrase

    # -- rendering ---------------------------------------------------------------
    def _generated_text(self, sequence: Sequence) -> str:
        text = sequence.full_text
        return sequence.request.prompt + text if self.return_full_text else text

    def _whole(self, sequence: Sequence) -> dict[str, Any]:
        body: dict[str, Any] = {"generated_text": self._generated_text(sequence)}
        if not self.details:
            return body
        texts = list(sequence.text)
        details: dict[str, Any] = {
            "finish_reason": FINISH_REASONS[sequence.finish_reason],
            "generated_tokens": sequence.completion_tokens,
            "seed": self.seed,
            "prefill": self._prefill(sequence) if self.prefill_details else [],
            "tokens": [self._token(sequence, i, texts[i]) for i in range(len(texts))],
        }
        if self.top_n:
            details["top_tokens"] = [self._top_tokens(sequence, i) for i in range(len(texts))]
        body["details"] = details
        return body

    def _stream_event(self, sequence: Sequence, i: int, text: str) -> dict[str, Any]:
        event: dict[str, Any] = {"index": i + 1, "token": self._token(sequence, i, text)}
        if self.top_n:
            event["top_tokens"] = self._top_tokens(sequence, i)
        event["generated_text"] = None
        event["details"] = None
        return event

    def _token(self, sequence: Sequence, i: int, text: str) -> dict[str, Any]:
        token_id = sequence.token_ids[i]
        choice = sequence.choices[i] if i < len(sequence.choices) else None
        logprob = choice.logprob if choice is not None else None
        return {"id": token_id, "text": text, "logprob": logprob, "special": self._is_special(sequence, token_id)}

    def _top_tokens(self, sequence: Sequence, i: int) -> list[dict[str, Any]]:
        choice = sequence.choices[i] if i < len(sequence.choices) else None
        if choice is None:
            return []
        return [
            {"id": tid, "text": _decode_one(sequence, tid), "logprob": lp, "special": self._is_special(sequence, tid)}
            for tid, lp in choice.top_logprobs
        ]

    def _prefill(self, sequence: Sequence) -> list[dict[str, Any]]:
        """The prompt's tokens with their logprobs from the prefill (the first one's is null).
        A backend that gave none (no logits, e.g. sim) leaves every logprob null."""
        pairs = [(p.token_id, p.logprob) for p in sequence.prompt_logprobs] or [
            (tid, None) for tid in sequence.prompt_ids
        ]
        return [{"id": tid, "text": _decode_one(sequence, tid), "logprob": lp} for tid, lp in pairs]

    def _is_special(self, sequence: Sequence, token_id: int) -> bool:
        if self._special is None:
            ids = getattr(sequence.tokenizer, "all_special_ids", None) or ()
            self._special = frozenset(ids) | sequence.eos_token_ids
        return token_id in self._special


def _decode_one(sequence: Sequence, token_id: int) -> str:
    """One token's text on its own (top tokens, prefill), special tokens kept, as TGI shows them."""
    return sequence.tokenizer.decode([token_id], skip_special_tokens=False)


def _field_name(path: list[Any]) -> str:
    """TGI names a parameter by itself (`temperature`, not `parameters.temperature`)."""
    return str(path[1]) if path[:1] == ["parameters"] and len(path) > 1 else dotted(path[:1])


def _unsupported(param: str, why: str = "") -> InvalidRequest:
    return InvalidRequest(f"`{param}` is not supported by this server{why}", param)


def _refuse_unsupported(params: TgiParameters, stream: bool) -> None:
    """Parameters that would change the answer and that this server cannot honour: a clear 422,
    never a silently different result."""
    if params.watermark:
        raise _unsupported("watermark")
    if params.best_of is not None and params.best_of != 1:
        if params.best_of < 1:
            raise InvalidRequest("`best_of` must be strictly positive", "best_of")
        raise _unsupported("best_of", " (only best_of=1)")
    if params.truncate is not None:
        raise _unsupported("truncate", "; send a prompt that fits")
    if params.typical_p is not None:
        raise _unsupported("typical_p")
    if stream and params.decoder_input_details:
        raise InvalidRequest("`decoder_input_details` == true is not supported when streaming tokens", "stream")


def _finite(value: float | int | None, param: str) -> float | None:
    if value is None:
        return None
    if not math.isfinite(value):
        raise InvalidRequest(f"`{param}` must be a finite number", param)
    return float(value)


def _sampling(params: TgiParameters) -> SamplingParams:
    """TGI's rule: sample when `do_sample` or any warper is away from its neutral value
    (temperature != 1, top_k, top_p < 1); otherwise greedy. A sampled request without a seed
    gets a random one, reported in `details.seed`."""
    temperature = _finite(params.temperature, "temperature")
    if temperature is not None and temperature <= 0:
        raise InvalidRequest("`temperature` must be strictly positive", "temperature")
    penalty = _finite(params.repetition_penalty, "repetition_penalty")
    if penalty is not None and penalty <= 0:
        raise InvalidRequest("`repetition_penalty` must be strictly positive", "repetition_penalty")
    if params.top_k is not None and params.top_k <= 0:
        raise InvalidRequest("`top_k` must be strictly positive", "top_k")
    top_p = _finite(params.top_p, "top_p")
    if top_p is not None and not 0 < top_p < 1:
        raise InvalidRequest("`top_p` must be > 0.0 and < 1.0", "top_p")
    if params.seed is not None and not 0 <= params.seed < SEED_LIMIT:
        raise InvalidRequest(f"`seed` must be >= 0 and < 2**63, got {params.seed}", "seed")
    temperature = 1.0 if temperature is None else temperature
    top_p = 1.0 if top_p is None else top_p
    top_k = params.top_k or 0
    do_sample = bool(params.do_sample) or temperature != 1.0 or top_k > 0 or top_p < 1.0
    seed = params.seed
    if do_sample and seed is None:
        seed = random.randrange(SEED_LIMIT)
    return SamplingParams(
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=1.0 if penalty is None else penalty,
        seed=seed,
        seed_from_client=params.seed is not None,
        frequency_penalty=penalty_value(_finite(params.frequency_penalty, "frequency_penalty"), "frequency_penalty"),
    )


def _top_n(value: int | None) -> int:
    if value is None:
        return 0
    if not 0 <= value <= MAX_TOP_N_TOKENS:
        raise InvalidRequest(f"`top_n_tokens` must be >= 0 and <= {MAX_TOP_N_TOKENS}. Given: {value}", "top_n_tokens")
    return value


def _max_new_tokens(value: int | None, limits: Limits) -> int:
    if value is not None and value <= 0:
        raise InvalidRequest("`max_new_tokens` must be strictly positive", "max_new_tokens")
    try:
        return checked_max_new_tokens(value, limits, "max_new_tokens")
    except InvalidRequest as exc:
        message = f"`max_new_tokens` must be <= {limits.max_new_tokens}. Given: {value}"
        raise InvalidRequest(message, exc.param) from None


def _stop(stop: str | list[str] | None, limits: Limits) -> tuple[str, ...]:
    too_many = "`stop` supports up to {limit} stop sequences. Given: {count}"
    return stop_strings(stop, limits, too_many, "`stop` sequences must not be empty")
