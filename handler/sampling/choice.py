"""The token choice itself, on one step's rows: the argmax of greedy rows, and for sampled rows
top-k, top-p and the inverse-CDF pick over the few most likely tokens (`sorted_candidates`), exact
on any sorted prefix (`choose_sorted`). `sampler.BatchSampler` calls these; they hold no state."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# Candidate set sizes tried in turn before the full sort. A model's top-p 0.9 nucleus is
# usually a few dozen tokens; topk(64) over 128,256 logits costs a fifth of topk(1024).
CANDIDATE_TIERS = (64, 1024)
# Rows are scanned in blocks of this many tokens: a block's max is one vectorized reduction,
# and only the best blocks are searched further (argmax and topk over a whole 128,256-token
# row are 4-6x slower than amax over it).
BLOCK = 64
PLAIN_ARGMAX_MAX = 1 << 19  # elements: up to here one argmax call is faster (measured cold, 2 cores)


@dataclass(frozen=True)
class Chosen:
    """The outcome of `choose_sorted` for a batch of rows, each array [rows]."""

    position: np.ndarray  # index of the chosen token in the sorted order
    kept: np.ndarray  # how many leading sorted tokens top-k / top-p keep
    mass: np.ndarray  # their total probability (the renormalizer), float64
    resolved: np.ndarray  # False: the answer lies beyond the given prefix


def choose_sorted(
    probs: np.ndarray,
    safe: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    draws: np.ndarray,
    vocab: int,
) -> Chosen:
    """Top-k, top-p and the inverse-CDF pick on probabilities sorted in descending order.

    `probs` [rows, C] is a prefix of each row's full sorted distribution; only its first
    `safe` [rows] entries are known to be exactly that prefix (ties past them may be missing);
    `safe` >= vocab says the prefix holds every token of nonzero probability (the rest are zeros).
    `top_k` 0 and `top_p` 1 mean off. Top-p keeps a token when the mass of the tokens before
    it is below top_p (transformers' TopPLogitsWarper, in descending terms), after top-k.
    The pick is the first kept token whose cumulative mass exceeds draw x kept mass. Masses
    are summed in float64, in order. With the whole vocabulary (C = vocab) every row is
    resolved. numpy, not torch: on [rows, 64] arrays the per-call overhead is the cost."""
    width = probs.shape[1]
    cumulative = np.cumsum(probs, axis=1, dtype=np.float64)
    before = np.zeros_like(cumulative)
    before[:, 1:] = cumulative[:, :-1]
    positions = np.arange(width)[None, :]
    k_on = (top_k > 0) & (top_k < vocab)
    k_eff = np.where(k_on, top_k, vocab)
    k_known = ~k_on | (k_eff <= safe)
    # Mass of the top-k tokens: top-p renormalizes inside it; without top-k it is the whole (1).
    k_index = np.maximum(np.minimum(np.minimum(k_eff, safe), width) - 1, 0)
    k_mass = np.where(k_on, np.take_along_axis(cumulative, k_index[:, None], axis=1)[:, 0], 1.0)
    p_on = top_p < 1.0
    keep = (positions < k_eff[:, None]) & (positions < safe[:, None])
    keep &= ~p_on[:, None] | (before < (top_p * k_mass)[:, None])
    kept = keep.sum(axis=1)
    # The kept set ends inside the known prefix, or is exactly the top-k inside it.
    set_known = k_known & ((p_on & ((kept < safe) | (k_on & (kept == k_eff)))) | (~p_on & k_on))
    set_known |= safe >= vocab
    last = np.maximum(kept - 1, 0)
    mass = np.where(p_on, np.take_along_axis(cumulative, last[:, None], axis=1)[:, 0], k_mass)
    passed = ((cumulative <= (draws * mass)[:, None]) & keep).sum(axis=1)
    position = np.minimum(passed, last)
    # Without top-k or top-p (mass 1) the pick is known once some known token passes the draw.
    pick_known = ~p_on & ~k_on & (passed < kept)
    return Chosen(position, kept, mass, set_known | pick_known)


def sorted_candidates(probs: torch.Tensor, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The `count` most likely tokens of each row, in descending probability, ties by token
    id (as a stable full sort orders them), and how many of them are certainly that prefix
    (those above the smallest candidate: a tie with it may have been left out). A row whose
    smallest candidate has probability 0 (a grammar-masked row: a few allowed tokens, the rest
    -inf) holds all of its nonzero mass: it is reported as known to the vocabulary's end, since
    the zeros past it are never picked and weigh nothing, so it needs no full sort."""
    rows, vocab = probs.shape
    if count >= vocab:
        values, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
        return values.numpy(), ids.numpy(), np.full(rows, vocab)
    values, ids = (t.numpy() for t in _topk(probs, count))
    order = np.lexsort((ids, -values), axis=-1)  # by probability, then by id
    values, ids = np.take_along_axis(values, order, axis=1), np.take_along_axis(ids, order, axis=1)
    safe = (values > values[:, -1:]).sum(axis=1)
    return values, ids, np.where(values[:, -1] == 0.0, vocab, safe)


def _blocks(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's whole blocks of BLOCK tokens [rows, blocks, BLOCK] and their maxima."""
    rows, vocab = scores.shape
    whole = scores[:, : vocab // BLOCK * BLOCK].view(rows, vocab // BLOCK, BLOCK)
    return whole, whole.amax(dim=-1)


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(-1)` (the first maximum on ties), by the best block of each row. A small
    input takes the plain argmax: one call beats the block path's five when the data is small
    (after the device step the host runs cold, and every call costs)."""
    rows, vocab = scores.shape
    if vocab < 16 * BLOCK or rows * vocab <= PLAIN_ARGMAX_MAX:
        return scores.argmax(dim=-1)
    whole, maxima = _blocks(scores)
    block = maxima.argmax(dim=-1)
    best = block * BLOCK + whole[torch.arange(rows), block].argmax(dim=-1)
    tail_start = whole.shape[1] * BLOCK
    if tail_start < vocab:  # the last partial block: ahead only when strictly larger (later ids)
        tail_max, tail_at = scores[:, tail_start:].max(dim=-1)
        best = torch.where(tail_max > maxima.gather(1, block[:, None])[:, 0], tail_at + tail_start, best)
    return best


def _topk(probs: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`torch.topk(probs, count)` (the order of ties aside): the `count` largest values lie in
    the `count` blocks with the largest maxima, so only those blocks are searched."""
    rows, vocab = probs.shape
    if count * BLOCK * 4 > vocab:
        return torch.topk(probs, count, dim=-1)
    whole, maxima = _blocks(probs)
    _, blocks = torch.topk(maxima, count, dim=-1)
    ids = (blocks[:, :, None] * BLOCK + torch.arange(BLOCK)).reshape(rows, -1)
    tail_start = whole.shape[1] * BLOCK
    if tail_start < vocab:
        ids = torch.cat([ids, torch.arange(tail_start, vocab).expand(rows, -1)], dim=1)
    values, at = torch.topk(probs.gather(1, ids), count, dim=-1)
    return values, ids.gather(1, at)
