"""Host sampling: the one layer between a backend whose device returns logits and the sampler
(`handler/sampling/`'s `BatchSampler`). hf, sim and the Neuron backends (through
device_slots.py) each own one, built once from the backend's facts:

    self.sampling = HostSampling(n_slots, eos_token_ids, n_positions, tokenizer, vocab_size)

and go through it for every token the host picks: `first_tokens` at prefill (each request's
sampling state registered, then one sampler call over the prefilled rows), `next_tokens` per
decode call, `release` when a slot ends, `refusal` for what the sampler cannot serve, `warmup`
(the grammar masks), `seconds` (what `Backend.sampling_s` reports). The rows of a call are
sampled together, in the order given; each row's result comes back in that order.

`vocab_size` is both the width of the grammar masks and where a row's padding starts: columns
past it are ignored on every call. hf's logits and neuronx's decode logits may carry the model's
or the device's padding; neuronx's prefill rows and nxdi's logits are cut to `vocab_size` by the
backend, and the sim's stand-in logits are exactly `vocab_size` wide, so the cut is a no-op there
(a model's logits are never narrower than its vocabulary). A backend whose device samples (nxdi
with on-device sampling) keeps the layer but does not call it for tokens: see `samples_on_host`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from handler.request import GenerationRequest, SlotRequest, TokenChoice
from handler.sampling.sampler import BatchSampler


class Sampler(Protocol):
    """What the layer drives: `BatchSampler`, or a stand-in with its interface (the bench's
    per-slot baseline, scripts/bench/per_slot_sampler.py, swaps one into the sim)."""

    last_s: float

    def add(self, request: SlotRequest) -> None: ...

    def sample(
        self, slots: Sequence[int], logits: torch.Tensor, vocab_size: int | None = None
    ) -> list[TokenChoice]: ...

    def remove(self, slot: int) -> None: ...

    def refusal(self, request: GenerationRequest) -> tuple[str, str] | None: ...

    def warmup(self) -> None: ...


class HostSampling:
    """Per-slot sampling state and the host's token choice for one backend's slots."""

    def __init__(
        self,
        n_slots: int,
        eos_token_ids: frozenset[int] | set[int],
        n_positions: int,
        tokenizer: Any = None,
        vocab_size: int | None = None,
    ) -> None:
        """`tokenizer`: the one grammar masks are built on (None: every constraint is refused);
        `vocab_size`: the token ids the model has (None: every column of the logits)."""
        self.vocab_size = vocab_size
        self.sampler: Sampler = BatchSampler(n_slots, eos_token_ids, n_positions, tokenizer, vocab_size)

    def first_tokens(self, requests: Sequence[SlotRequest], last_logits: torch.Tensor) -> list[TokenChoice]:
        """Registers each request's sampling state (`register`), then samples the prefilled rows:
        `last_logits` [len(requests), >= vocab], row i the last prompt position of requests[i]."""
        for request in requests:
            self.register(request)
        return self.next_tokens([request.slot for request in requests], last_logits)

    def register(self, request: SlotRequest) -> None:
        """One request's sampling state (seed, penalties' history, grammar), kept until `release`.
        Raises SlotRequestError when its constraint cannot be enforced; nothing is kept then.
        `first_tokens` calls it; a backend calls it alone only where the time of the refusal
        matters (the sim, before it charges the request's simulated prefill)."""
        self.sampler.add(request)

    def next_tokens(self, slots: Sequence[int], logits: torch.Tensor) -> list[TokenChoice]:
        """One call's rows, all registered: `logits` [len(slots), >= vocab], row i slots[i]'s.
        The input is never modified."""
        return self.sampler.sample(slots, logits, self.vocab_size)

    def release(self, slot: int) -> None:
        """Forget the slot's sampling state; a slot never registered is a no-op."""
        self.sampler.remove(slot)

    def refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """("constraint", why) when the sampler cannot enforce the request's constraint; builds nothing."""
        return self.sampler.refusal(request)

    def warmup(self) -> None:
        """Build the grammar masks now, so that no request's step pays for them."""
        self.sampler.warmup()

    @property
    def seconds(self) -> float:
        """Host seconds the last `first_tokens` or `next_tokens` call spent choosing tokens."""
        return self.sampler.last_s
