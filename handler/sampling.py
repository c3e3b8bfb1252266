"""Per-slot token choice from logits, for the backends that produce logits (hf, neuronx).

Every slot runs its own chain of transformers' logits processors and draws with its own
`torch.Generator`, so a request's tokens do not depend on its batch-mates and a seeded
request is reproducible. The sampler keeps the slot's token history (prompt + generated)
for the repetition penalty.
"""

from __future__ import annotations

import torch
from transformers import (
    LogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from handler.backends.base import PromptTokenLogprob, SlotRequest, TokenChoice


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
        return TokenChoice(token, float(logprobs[token]), _top(logprobs, self.logprobs))


def _top(logprobs: torch.Tensor, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely (token id, logprob) of one position's [vocab] logprobs. The values are
    the same float32 numbers the chosen token's logprob is read from, so a client comparing
    them (lm-eval's is_greedy) compares equal floats."""
    if n <= 0:
        return ()
    values, ids = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    return tuple((int(i), float(v)) for i, v in zip(ids, values, strict=False))


def prompt_logprobs(logits: torch.Tensor, prompt_ids: tuple[int, ...], n_top: int) -> tuple[PromptTokenLogprob, ...]:
    """Each prompt token's logprob under the model's own log-softmax (no sampling processor
    applies to a prompt): `logits` [T or more, vocab] are a prefill's per-position logits,
    row i predicting token i + 1. The first token has nothing before it: None."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    out = [PromptTokenLogprob(prompt_ids[0], None)]
    for position, token in enumerate(prompt_ids[1:]):
        row = logprobs[position]
        out.append(PromptTokenLogprob(token, float(row[token]), _top(row, n_top)))
    return tuple(out)


# Processors other than the repetition penalty ignore input_ids; a 1x0 tensor keeps them happy.
_NO_IDS = torch.zeros((1, 0), dtype=torch.long)
