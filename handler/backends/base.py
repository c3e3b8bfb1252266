"""The step-level contract every backend (hf, sim, neuronx) fulfils.

A backend holds `n_slots` slots, one sequence each. The engine drives it a step at a
time (TGI's Neuron `Generator` and vLLM's model runner work this way):

- `prefill(requests)`: encode each new request's prompt into its slot; return its first
  token;
- `decode(slots)`: one token more for each of the given live slots (each slot's input is
  the token it returned last);
- `release(slot)`: the slot's sequence ended (finished, failed, cancelled); forget it.

Backends pick tokens (every row of a call at once, with `handler/sampling/`) but never decide
when a sequence ends: EOS, stop strings and lengths are `Sequence`'s business. The
engine calls one method at a time (never concurrently), puts every live slot in every
decode call, keeps each request within `n_positions` (prompt + max_new_tokens), and
releases every slot of a call that raised.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

from handler.request import GenerationRequest, SlotRequest, TokenChoice

logger = logging.getLogger(__name__)


def clamp_n_positions(wanted: int, limit: int | None, what: str) -> int:
    """The configured n_positions, or less (with a warning) when the model allows fewer."""
    if limit is None or wanted <= limit:
        return wanted
    logger.warning("n_positions %d is above the %s's %d positions; using %d", wanted, what, limit, limit)
    return limit


class Backend(ABC):
    """A loaded model with `n_slots` sequence slots, driven a step at a time."""

    name: str
    tokenizer: Any
    n_positions: int
    eos_token_ids: frozenset[int]
    n_slots: int
    # The longest prompt one prefill takes (neuronx: the largest context bucket); None: n_positions bounds it.
    max_prompt_tokens: int | None = None
    # Token ids the model accepts are 0..vocab_size-1 (None: the tokenizer's length).
    vocab_size: int | None = None

    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        """Why this backend cannot return the logprobs a request asks for, or None when it can.
        The service asks once, in `prepare`, and answers 400 naming the request's field."""
        return None

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """(the request field, why) when this backend cannot sample as a request asks (nxdi with
        on-device sampling has no seed, penalties or grammar); None when it can. Asked in `prepare`;
        the field is the domain's name (`sampling.seed` is "seed", `constraint`, ...)."""
        return None

    @property
    def sampling_s(self) -> float:
        """Host seconds the last prefill or decode call spent choosing tokens (0 for a backend
        that does not sample on the host); the engine records it per step."""
        return 0.0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    @abstractmethod
    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        """Prefill each request into its (free) slot; its first token, in request order."""

    @abstractmethod
    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        """One decode step over live slots; each one's next token, in `slots` order."""

    @abstractmethod
    def release(self, slot: int) -> None:
        """Forget the slot's sequence; the slot may be prefilled again."""

    def warmup(self) -> None:
        """Run whatever the first real request would otherwise pay for."""

    def close(self) -> None:
        """Release the model."""
