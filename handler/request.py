"""Domain types of one generation request and of the tokens it gets back, shared by the wire
protocols (`api/`), the engine, the backends and the sampler (`sampling/`); no wire format here.
`SlotRequest` is one sequence of a request entering a backend's slot (what prefill and the sampler
take), `DecodeRow` one live slot of a decode step, `SlotRequestError` a backend's or the sampler's
refusal of one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

ConstraintKind = Literal["json_object", "json_schema", "regex", "lark"]


@dataclass(frozen=True)
class Constraint:
    """What the output must match (structured output): the sampler masks every token that would
    leave the language, and the only token left once the output is complete is EOS.

    `value` is the JSON Schema as JSON text (json_schema), the regular expression (regex), the
    Lark grammar (lark, which may embed `%json{...}` schemas), or "" (json_object: any one JSON
    object)."""

    kind: ConstraintKind
    value: str = ""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token; `do_sample=False` is greedy."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    # False for a seed the server drew itself (TGI reports one for every sampled request): a
    # backend that cannot seed (nxdi's on-device sampling) refuses only a seed the client chose.
    seed_from_client: bool = True
    # OpenAI's penalties: subtracted from a token's logit by whether (presence) and how often
    # (frequency) it appeared in this request's output so far. 0 is off.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) added to the logits; ids are checked against the vocabulary on receipt.
    logit_bias: tuple[tuple[int, float], ...] = ()
    # EOS and the stop token ids are suppressed until this many tokens were generated.
    min_tokens: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    """One validated request; everything downstream trusts it."""

    prompt: str
    max_new_tokens: int
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    stream: bool = True
    ignore_eos: bool = False
    # False for a prompt that already holds its special tokens (a rendered chat template).
    add_special_tokens: bool = True
    # None: no logprobs; 0: the chosen token's; n: also the n most likely alternatives.
    logprobs: int | None = None
    # The prompt's own logprobs too (OpenAI `echo`, TGI `decoder_input_details`), each token's
    # with `logprobs` alternatives (0 when `logprobs` is None).
    prompt_logprobs: bool = False
    # A prompt given as token ids (OpenAI completions' list-of-ints prompt): used as is, never
    # re-tokenized and no special tokens added; `prompt` then holds its decoded text.
    prompt_token_ids: tuple[int, ...] | None = None
    # Token ids that end the output like EOS does (finish reason "stop"), kept in the output.
    stop_token_ids: tuple[int, ...] = ()
    constraint: Constraint | None = None
    # Independent outputs for the one prompt (OpenAI `n`), each its own slot; output i samples
    # with seed + i when the request has a seed.
    n: int = 1
    # The LoRA adapter (by its configured name) the request runs with; None: the base model.
    adapter: str | None = None


class SlotRequestError(ValueError):
    """One request of a prefill or decode call that the backend cannot take (a grammar that does not
    compile for this tokenizer; a position past what the compiled graphs serve); the others of the
    call are fine. The engine fails that request alone (a 400 naming `param`, the request field to
    blame) and runs the call again without it."""

    def __init__(self, slot: int, message: str, param: str = "constraint") -> None:
        super().__init__(message)
        self.slot = slot
        self.param = param


@dataclass(frozen=True)
class SlotRequest:
    """A sequence entering a slot: what the backend needs to prefill and sample it."""

    slot: int
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    ignore_eos: bool = False  # EOS is suppressed while sampling (the request asked to run to its length)
    logprobs: int | None = None  # None: none; 0: the chosen token's; n: also the n most likely
    prompt_logprobs: bool = False  # prefill also returns each prompt token's logprob (TokenChoice.prompt)
    stop_token_ids: tuple[int, ...] = ()  # end the output like EOS (suppressed with EOS before min_tokens)
    constraint: Constraint | None = None  # the output must match it (structured output)
    adapter_id: str | None = None  # the LoRA adapter it runs with, by name (None: the base model)


@dataclass(frozen=True)
class DecodeRow:
    """One live slot of a decode step, as the engine's step plan gives it to the backend
    (`Backend.decode_plan`).

    `max_tokens`: how many tokens the row may take this step, at least 1 and never more than what
    its sequence may still generate (1 unless the backend decodes several tokens a step, e.g. by
    speculation: `Backend.tokens_per_step`). `adapter_id`: the LoRA adapter the row runs with, by
    name (None: the base model); the same as its prefill's. `proposal`: tokens guessed to follow
    (speculative decoding: handler/engine/ngram.py), at most `max_tokens` - 1; the backend verifies
    them in the step's forward and takes those the model would have chosen, or ignores them (a row
    it cannot verify exactly decodes one token)."""

    slot: int
    max_tokens: int = 1
    adapter_id: str | None = None
    proposal: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"slot {self.slot}: a decode row takes at least 1 token, not {self.max_tokens}")
        if len(self.proposal) >= self.max_tokens:
            raise ValueError(
                f"slot {self.slot}: {len(self.proposal)} proposed tokens, but the row may take {self.max_tokens}"
            )


@dataclass(frozen=True)
class Limits:
    """What the deployment allows; from the handler config."""

    default_max_new_tokens: int
    max_new_tokens: int
    max_stop_strings: int = 16
    max_stop_chars: int = 4096  # all stop strings together
    max_json_depth: int = 64  # nesting of the request body
    adapters: frozenset[str] = frozenset()  # the LoRA adapters a request may name (handler.lora.adapters)


@dataclass(frozen=True)
class AdapterChange:
    """A LoRA adapter loaded (from `path`, as the request gave it) or, with `path` None, unloaded
    while serving (handler.lora.runtime_updates)."""

    name: str
    path: str | None


@dataclass(frozen=True)
class PromptTokenLogprob:
    """One prompt token's logprob given the tokens before it (None for the first token, which
    has nothing before it), with the `logprobs` most likely alternatives at that position.
    These are the model's own log-softmax: no sampling processor applies to a prompt."""

    token_id: int
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class TokenChoice:
    """One slot's token from one step, with its logprob when the request asked for it.

    Logprobs are those of the distribution the token was drawn from: after repetition
    penalty, temperature, top-k and top-p (so a greedy request gets the model's own
    log-softmax). `prompt` is filled by prefill only, for a request with prompt_logprobs."""

    token_id: int
    logprob: float | None = None
    top_logprobs: tuple[tuple[int, float], ...] = ()
    prompt: tuple[PromptTokenLogprob, ...] = ()
    # The slot's constraint could not be followed past this step (the grammar engine gave up): the
    # token is EOS and the request ends with this reason as its error, never as a normal stop.
    constraint_failure: str | None = None
