"""Taking proposed tokens so that the output keeps exactly the distribution of decoding one token at a
time (speculative decoding, docs/speculative.md), for every kind of row: greedy, sampled, penalised,
shaped, constrained by a grammar, with logprobs.

A row proposes k tokens x_1..x_k (prompt lookup: handler/engine/ngram.py); one forward of the row with
them gives the target's logits at each of the k + 1 positions. The row's sampler picks its token at
position 1 exactly as a step of its own would (same shaping, same draw from the row's own seeded
stream); while the pick equals the proposal there, the next position's logits were computed on the
right text and the sampler picks again; the first pick that differs from its proposal, or the pick
after the last proposal (the bonus token), ends the row's step. Every pick is taken.

This is speculative sampling with a one-token (deterministic) draft q = δ(x) (Leviathan et al. 2023,
Chen et al. 2023), realised by coupling: the pick y ~ p_i, and "y == x_i" is the acceptance, an event
of probability p_i(x_i) = min(1, p_i(x_i) / q(x_i)); given a rejection, y is distributed as p_i with
x_i removed, renormalised (the residual norm(max(0, p_i - q))). So the output has exactly the target's
distribution, and more: the picks are the very tokens one-at-a-time decoding draws, since each is made
by the same sampler state, in the same order, from the same stream of draws. A seeded request gives
the same text with and without speculation, and a grammar's matcher, a penalty's history or a
`min_tokens` count only ever advance over tokens the row takes: nothing to roll back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from handler.request import TokenChoice

# (rows, position) -> each row's pick at that position, in `rows` order. Picking advances the rows'
# sampling state (their draw stream, penalty history, grammar), as a step of their own would.
Pick = Callable[[list[int], int], Sequence[TokenChoice]]


def take_verified(proposals: Sequence[Sequence[int]], pick: Pick) -> list[list[TokenChoice]]:
    """The tokens each row takes this step, 1 to len(proposal) + 1, row i proposing `proposals[i]`.
    `pick` is called once per position, 0 first, over the rows still going (all of them at 0), so a
    step costs at most k + 1 sampler calls however many rows it holds."""
    taken: list[list[TokenChoice]] = [[] for _ in proposals]
    going = list(range(len(proposals)))
    position = 0
    while going:
        picks = pick(going, position)
        if len(picks) != len(going):
            raise ValueError(f"pick answered {len(picks)} rows for {len(going)}")
        still = []
        for row, choice in zip(going, picks, strict=True):
            taken[row].append(choice)
            proposal = proposals[row]
            if position < len(proposal) and choice.token_id == proposal[position]:
                still.append(row)
        going = still
        position += 1
    return taken
