"""Per-row sampling and stopping on top of Hugging Face `generate`.

`generate` takes one GenerationConfig for the whole batch, but every request in a
micro-batch has its own temperature, top-k/top-p, penalty, seed and length. So each
row runs its own chain of transformers' logits processors and draws its token with
its own `torch.Generator`; the chosen token is returned as the only finite logit and
`generate` runs greedy over it. A row's output is then the same whoever its
batch-mates are, and a seeded request is reproducible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from handler.backends.base import RowSpec


class _RowSampler:
    def __init__(self, row: RowSpec, eos_token_ids: frozenset[int]) -> None:
        params = row.sampling
        self.do_sample = params.do_sample
        chain: list[LogitsProcessor] = []
        if params.repetition_penalty != 1.0:
            chain.append(RepetitionPenaltyLogitsProcessor(params.repetition_penalty))
        if row.ignore_eos and eos_token_ids:
            chain.append(SuppressTokensLogitsProcessor(sorted(eos_token_ids)))
        if params.do_sample:
            if params.temperature != 1.0:
                chain.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                chain.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1.0:
                chain.append(TopPLogitsWarper(params.top_p))
        self.processors = LogitsProcessorList(chain)
        self.generator = torch.Generator()
        if params.seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(params.seed)

    def pick(self, input_ids: torch.Tensor, scores: torch.Tensor) -> int:
        scores = self.processors(input_ids, scores.float())
        if not self.do_sample:
            return int(scores.argmax(dim=-1))
        probs = torch.softmax(scores, dim=-1)
        return int(torch.multinomial(probs, 1, generator=self.generator))


class RowwiseSampler(LogitsProcessor):
    """Picks each row's next token with that row's own parameters (padding rows: token 0)."""

    def __init__(self, rows: Sequence[RowSpec | None], eos_token_ids: frozenset[int]) -> None:
        self._samplers = [None if row is None else _RowSampler(row, eos_token_ids) for row in rows]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        chosen = torch.full_like(scores, float("-inf"))
        for i, sampler in enumerate(self._samplers):
            token = 0 if sampler is None else sampler.pick(input_ids[i : i + 1], scores[i : i + 1])
            chosen[i, token] = 0.0
        return chosen


class RowStoppingCriteria(StoppingCriteria):
    """Per-row stop: its own max_new_tokens, or the engine says it is done (stop string)."""

    def __init__(self, max_new_tokens: Sequence[int], prompt_length: int, is_finished: Callable[[int], bool]) -> None:
        self._max_new_tokens = list(max_new_tokens)
        self._prompt_length = prompt_length
        self._is_finished = is_finished

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: object) -> torch.BoolTensor:
        generated = input_ids.shape[1] - self._prompt_length
        done = [generated >= limit or self._is_finished(i) for i, limit in enumerate(self._max_new_tokens)]
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


def left_pad(prompts: Sequence[Sequence[int]], pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded input ids and attention mask: generated tokens line up on the right."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, prompt in enumerate(prompts):
        input_ids[i, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[i, width - len(prompt) :] = 1
    return input_ids, attention_mask
