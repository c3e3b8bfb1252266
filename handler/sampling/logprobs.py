"""Logprobs as the sampler reports them: a position's most likely alternatives, and a prompt's own
logprobs under the model's log-softmax (a prefill's per-position logits)."""

from __future__ import annotations

import numpy as np
import torch

from handler.request import PromptTokenLogprob


def top_alternatives(logprobs: torch.Tensor, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely (token id, logprob) of one position's [vocab] logprobs. The values are
    the same float32 numbers the chosen token's logprob is read from, so a client comparing
    them (lm-eval's is_greedy) compares equal floats. Tokens of logprob -inf (suppressed, or
    outside a grammar) are no alternatives."""
    if n <= 0:
        return ()
    values, ids = torch.topk(logprobs, min(n, logprobs.shape[-1]))
    pairs = ((int(i), float(v)) for i, v in zip(ids, values, strict=False))
    return tuple(pair for pair in pairs if pair[1] > -np.inf)


def prompt_logprobs(logits: torch.Tensor, prompt_ids: tuple[int, ...], n_top: int) -> tuple[PromptTokenLogprob, ...]:
    """Each prompt token's logprob under the model's own log-softmax (no sampling processor
    applies to a prompt): `logits` [T or more, vocab] are a prefill's per-position logits,
    row i predicting token i + 1. The first token has nothing before it: None."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    out = [PromptTokenLogprob(prompt_ids[0], None)]
    for position, token in enumerate(prompt_ids[1:]):
        row = logprobs[position]
        out.append(PromptTokenLogprob(token, float(row[token]), top_alternatives(row, n_top)))
    return tuple(out)
