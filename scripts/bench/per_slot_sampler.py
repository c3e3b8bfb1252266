"""The per-slot sampler this project used before `handler/sampling/`'s `BatchSampler`: a chain of
transformers' logits processors run on one row at a time, each slot with its own generator.

Kept only as the baseline the bench compares against, never in handler/ nor reachable from a
model config:
- P8: `scripts/bench/sampling.py` times both samplers in process;
- P2s: `scripts/bench/suite.py` serves the sampled load once more from an archive whose TorchServe
  entry is this file (`handle` below): the archive's own handler with the sim backend sampling
  through `PerSlotSimModel`. Only an archive staged with this file as its handler gets it.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from handler.backends import sim
from handler.request import GenerationRequest, SlotRequest, SlotRequestError, TokenChoice
from handler.sampling.logprobs import top_alternatives

NO_GRAMMAR = "the per-slot sampler is the benchmark baseline; it applies no grammar mask"


class SuppressTokens(LogitsProcessor):
    """The tokens' scores set to -inf. transformers' SuppressTokensLogitsProcessor does the same
    but builds an arange over the vocabulary and runs `torch.isin` on every call: about 0.1 ms
    per row at a 512-token vocabulary and 0.5 ms at 32000, paid by every ignore_eos row of
    every step."""

    def __init__(self, token_ids: frozenset[int] | set[int]) -> None:
        self.token_ids = torch.tensor(sorted(token_ids), dtype=torch.long)

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        ids = self.token_ids[self.token_ids < scores.shape[-1]]
        return scores.index_fill(-1, ids, float("-inf"))


class SlotSampler:
    def __init__(self, request: SlotRequest, eos_token_ids: frozenset[int]) -> None:
        params = request.sampling
        self.do_sample = params.do_sample
        self.logprobs = request.logprobs
        chain: list[LogitsProcessor] = []
        self._needs_history = params.repetition_penalty != 1.0
        if self._needs_history:
            chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if request.ignore_eos and eos_token_ids:
            chain.append(SuppressTokens(eos_token_ids))
        if params.do_sample:
            if params.temperature != 1.0:
                chain.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                chain.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                chain.append(TopPLogitsWarper(params.top_p))
        self.processors = chain  # called one by one: LogitsProcessorList inspects each signature, every call
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)
        self.history: list[int] = list(request.prompt_ids)

    def pick(self, logits: torch.Tensor) -> TokenChoice:
        """The next token from one slot's last-position logits ([vocab] or [1, vocab])."""
        scores = logits.reshape(1, -1).float()
        if len(self.processors):
            ids = torch.tensor([self.history], dtype=torch.long) if self._needs_history else _NO_IDS
            for processor in self.processors:
                scores = processor(ids, scores)
        if self.do_sample:
            probs = torch.softmax(scores, dim=-1)
            token = int(torch.multinomial(probs, 1, generator=self.generator))
        else:
            token = int(scores.argmax(dim=-1))
        self.history.append(token)
        if self.logprobs is None:
            return TokenChoice(token)
        logprobs = torch.log_softmax(scores, dim=-1)[0]
        return TokenChoice(token, float(logprobs[token]), top_alternatives(logprobs, self.logprobs))


# Processors other than the repetition penalty ignore input_ids; a 1x0 tensor keeps them happy.
_NO_IDS = torch.zeros((1, 0), dtype=torch.long)


class PerSlotSampler:
    """`BatchSampler`'s interface over one `SlotSampler` per slot, row after row."""

    def __init__(self, n_slots: int, eos_token_ids: frozenset[int] | set[int], n_positions: int) -> None:
        self.eos_token_ids = frozenset(eos_token_ids)
        self._slots: dict[int, SlotSampler] = {}
        self.last_s = 0.0

    def warmup(self) -> None:
        """Nothing to build: no grammar masks."""

    def refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        return ("constraint", NO_GRAMMAR) if request.constraint is not None else None

    def add(self, request: SlotRequest) -> None:
        if request.constraint is not None:
            raise SlotRequestError(request.slot, NO_GRAMMAR)
        self._slots[request.slot] = SlotSampler(request, self.eos_token_ids)

    def remove(self, slot: int) -> None:
        self._slots.pop(slot, None)

    def sample(self, slots, logits: torch.Tensor, vocab_size: int | None = None) -> list[TokenChoice]:
        started = time.perf_counter()
        vocab = vocab_size or logits.shape[-1]
        out = [self._slots[slot].pick(row[:vocab]) for slot, row in zip(slots, logits, strict=True)]
        self.last_s = time.perf_counter() - started
        return out


class PerSlotSimModel(sim.SimModel):
    """The sim's simulated device with the per-slot sampler on its stand-in logits."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sampler = PerSlotSampler(self.profile.batch_size, {self.eos_token_id}, self.n_positions)


_served: list[Any] = []  # the archive's handler, once `handle` built it


def handle(data: Any, context: Any) -> Any:
    """TorchServe's entry point when an archive is staged with this file as its handler (P2s's
    baseline server): TorchServe calls a handler module's `handle` once without data to load the
    model, then with each batch. The sim backends this process builds sample per slot; the rest is
    the archive's own handler (handler/inf2_handler.py)."""
    if not _served:
        sim.SimModel = PerSlotSimModel  # type: ignore[misc]  # read by SimBackend when it builds its model
        from handler.inf2_handler import Inf2StreamingHandler

        served = Inf2StreamingHandler()
        served.initialize(context)
        _served.append(served)
    return None if data is None else _served[0].handle(data, context)
