"""Accepting proposed tokens so that the output keeps exactly the distribution of decoding one token
at a time (speculative decoding, docs/speculative.md). The hf backend's verify step takes greedy rows'
tokens with `accept_greedy`; `accept_sampled`, for sampled rows, is not wired yet.

A row proposes k tokens x_1..x_k (prompt lookup: handler/engine/ngram.py); one forward of the row
with them gives the target's next-token distribution at each of the k + 1 positions, p_1..p_{k+1},
p_i being the request's shaped distribution (temperature, top-k, top-p, penalties, bias, grammar
mask) given the tokens before it. A deterministic proposal is a draft distribution q = δ(x), so
speculative sampling (Leviathan et al. 2023, Chen et al. 2023) reads:

- at position i, accept x_i with probability min(1, p_i(x_i) / q(x_i)) = p_i(x_i);
- on a rejection, draw from the residual norm(max(0, p_i - q)): p_i with x_i removed, renormalised,
  and stop: later positions were computed on a rejected token;
- when all k are accepted, draw the bonus token from p_{k+1}.

The token that comes out of position i has probability p_i(x) (accepted) plus, for y != x,
(1 - p_i(x)) p_i(y) / (1 - p_i(x)) = p_i(y): p_i itself. A greedy row is the limit: p_i is one-hot
on the argmax, so the accepted prefix is the proposals that equal the argmax, then the argmax.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def accept_greedy(proposal: Sequence[int], argmax: Sequence[int]) -> list[int]:
    """The tokens a greedy row takes: the proposals equal to the target's argmax at their position,
    then the argmax where the first differs (or the bonus one after all k). `argmax` holds the k + 1
    positions' choices."""
    if len(argmax) != len(proposal) + 1:
        raise ValueError(f"{len(proposal)} proposals need {len(proposal) + 1} target tokens, got {len(argmax)}")
    taken: list[int] = []
    for proposed, target in zip(proposal, argmax, strict=False):
        taken.append(target)
        if proposed != target:
            return taken
    taken.append(argmax[-1])
    return taken


def accept_sampled(proposal: Sequence[int], probs: torch.Tensor, generator: torch.Generator) -> list[int]:
    """The tokens a sampled row takes. `probs` [k + 1, vocab]: each position's shaped distribution
    (rows summing to 1). Draws come from `generator` only, in a fixed order (one uniform per
    proposal examined, then one categorical draw), so a seeded request repeats itself."""
    if probs.dim() != 2 or probs.shape[0] != len(proposal) + 1:
        raise ValueError(f"{len(proposal)} proposals need [{len(proposal) + 1}, vocab] probabilities")
    taken: list[int] = []
    for i, proposed in enumerate(proposal):
        p = probs[i]
        if torch.rand((), generator=generator, dtype=torch.float64).item() < float(p[proposed]):
            taken.append(proposed)
            continue
        residual = p.clone()
        residual[proposed] = 0.0
        if float(residual.sum()) <= 0.0:  # p was all on x: a rejection has probability 0 (rounding only)
            taken.append(proposed)
            continue
        taken.append(int(torch.multinomial(residual, 1, generator=generator)))
        return taken
    taken.append(int(torch.multinomial(probs[-1], 1, generator=generator)))
    return taken
