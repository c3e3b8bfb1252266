"""Issue 45's exactness rule, apart from any backend: `take_verified` keeps the distribution of
one-token decoding (chi-square over 20,000 draws on a small vocabulary, fixed seed, against the target
itself and against a two-token chain sampled one token at a time), accepts a proposal exactly as often
as speculative sampling does (p(x)), takes the argmax prefix for a greedy row, and gives a seeded row
the very tokens of one-at-a-time decoding; and prompt lookup proposes what followed the last n-gram."""

from __future__ import annotations

import bisect
import itertools
import random

import numpy as np
import pytest
import torch
from scipy.stats import binomtest, chisquare

from handler.engine.ngram import NgramProposer
from handler.request import TokenChoice
from handler.sampling.speculative import take_verified

DRAWS = 20_000
ALPHA = 1e-3  # a correct rule fails this 1 time in 1,000; a biased one (tests below) fails always


def counts(values: list[int], size: int) -> np.ndarray:
    return np.bincount(np.asarray(values), minlength=size)


def expected(probs: torch.Tensor) -> np.ndarray:
    """DRAWS times the distribution, in float64 summing to DRAWS (chisquare checks the totals agree)."""
    p = probs.double().numpy()
    return DRAWS * p / p.sum()


_CDFS: dict[int, list[float]] = {}


def inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token a uniform draw picks (what the sampler does, on a toy scale)."""
    cdf = _CDFS.get(id(probs))
    if cdf is None:
        cdf = _CDFS[id(probs)] = list(itertools.accumulate(probs.double().tolist()))
    return min(bisect.bisect_right(cdf, u), len(cdf) - 1)


def chain_pick(draws: random.Random, dist_at, proposal):
    """A one-row pick over a toy model: `dist_at(tokens)` is the next-token distribution after them;
    position i's context is the proposal's first i tokens (what the forward ran on)."""

    def pick(rows, position):
        assert rows == [0]
        return [TokenChoice(inverse_cdf(dist_at(list(proposal[:position])), draws.random()))]

    return pick


# -- greedy ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("proposal", "argmax", "taken"),
    [
        ((5, 6, 7), (5, 6, 7, 8), [5, 6, 7, 8]),  # all accepted, and the bonus token
        ((5, 6, 7), (5, 9, 7, 8), [5, 9]),  # the first mismatch: the target's token, then stop
        ((5,), (4, 1), [4]),
        ((), (3,), [3]),  # no proposal: one token, as without speculation
    ],
)
def test_greedy_takes_the_argmax_prefix(proposal, argmax, taken):
    positions = []

    def pick(rows, position):
        positions.append(position)
        return [TokenChoice(argmax[position]) for _ in rows]

    assert [c.token_id for c in take_verified([proposal], pick)[0]] == taken
    assert positions == list(range(len(taken)))  # never a pick past the first mismatch


def test_rows_stop_on_their_own_and_each_position_is_one_call():
    calls = []

    def pick(rows, position):
        calls.append((list(rows), position))
        return [TokenChoice(10 * row + position) for row in rows]  # row r picks 10r, 10r + 1, ...

    taken = take_verified([(), (10, 11, 99), (20, 21, 22)], pick)
    assert [[c.token_id for c in row] for row in taken] == [[0], [10, 11, 12], [20, 21, 22, 23]]
    assert calls == [([0, 1, 2], 0), ([1, 2], 1), ([1, 2], 2), ([2], 3)]


# -- sampled: one position -----------------------------------------------------------------------
P = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])


@pytest.mark.parametrize("proposed", [0, 1, 3])
def test_a_proposed_token_comes_out_with_exactly_the_targets_distribution(proposed: int):
    draws = random.Random(1234 + proposed)
    firsts, accepted = [], 0
    for _ in range(DRAWS):
        taken = take_verified([(proposed,)], chain_pick(draws, lambda _: P, (proposed,)))[0]
        firsts.append(taken[0].token_id)
        accepted += len(taken) == 2
    assert chisquare(counts(firsts, 5), expected(P)).pvalue > ALPHA
    # Accepted as often as speculative sampling accepts a one-token draft: p(x) (min(1, p(x) / q(x)), q = δ(x)).
    assert binomtest(accepted, DRAWS, float(P[proposed])).pvalue > ALPHA


def test_the_test_sees_a_biased_rule():
    """The same check on a rule that accepts the proposal too often: it must fail, or the test above
    proves nothing."""
    draws = random.Random(7)
    biased = [1 if draws.random() < 0.7 else inverse_cdf(P, draws.random()) for _ in range(DRAWS)]
    assert chisquare(counts(biased, 5), expected(P)).pvalue < ALPHA


# -- sampled: a chain ----------------------------------------------------------------------------
# A toy model over 4 tokens: the next token's distribution given the last one (token 0 before any).
TRANSITIONS = torch.tensor(
    [
        [0.1, 0.6, 0.2, 0.1],
        [0.3, 0.1, 0.5, 0.1],
        [0.25, 0.25, 0.25, 0.25],
        [0.7, 0.1, 0.1, 0.1],
    ]
)


ROWS = list(TRANSITIONS)  # the same tensor objects each time (inverse_cdf caches by object)


def after(tokens: list[int]) -> torch.Tensor:
    return ROWS[tokens[-1] if tokens else 0]


def test_two_tokens_by_speculation_have_the_joint_distribution_of_one_at_a_time():
    """From token 0, propose (1, 2): the two tokens that come out (the first position, then the
    second or the correction's follower) are distributed as the chain's own two steps."""
    draws = random.Random(99)
    pairs = []
    for _ in range(DRAWS):
        taken = [c.token_id for c in take_verified([(1, 2)], chain_pick(draws, after, (1, 2)))[0]]
        if len(taken) == 1:  # rejected at once: the second token is the next step, one at a time
            taken.append(inverse_cdf(after(taken), draws.random()))
        pairs.append(taken[0] * 4 + taken[1])
    joint = (TRANSITIONS[0][:, None] * TRANSITIONS).reshape(-1)
    assert chisquare(counts(pairs, 16), expected(joint)).pvalue > ALPHA


@pytest.mark.parametrize("seed", range(20))
def test_a_seeded_row_gets_the_tokens_of_one_at_a_time_decoding(seed: int):
    """The coupling's promise: the same draws give the same text with and without proposals, whatever
    they propose (here: what followed the last token before, as prompt lookup would)."""
    one_at_a_time, draws = [], random.Random(seed)
    while len(one_at_a_time) < 40:
        one_at_a_time.append(inverse_cdf(after(one_at_a_time), draws.random()))
    speculated, draws = [], random.Random(seed)
    while len(speculated) < 40:
        proposal = tuple(NgramProposer(k=3).propose([0, *speculated]))
        context = list(speculated)

        def pick(rows, position, context=context, proposal=proposal):
            return [TokenChoice(inverse_cdf(after(context + list(proposal[:position])), draws.random()))]

        speculated += [c.token_id for c in take_verified([proposal], pick)[0]]
    assert speculated[:40] == one_at_a_time


# -- prompt lookup ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("tokens", "proposal"),
    [
        ([1, 2, 3, 4, 9, 2, 3], (4, 9, 2)),  # "2 3" seen before: what followed it
        ([1, 2, 3, 4, 1, 2, 3, 5, 2, 3], (5, 2, 3)),  # the most recent occurrence wins
        ([7, 8, 9, 7, 8, 1, 8], (1, 8)),  # no 2-gram repeats: "8" at its latest earlier place, cut at the end
        ([1, 2, 3], ()),  # nothing repeats
        ([4, 4], (4,)),  # a run: what follows is what the text holds, cut at its end
        ([], ()),
    ],
)
def test_prompt_lookup_proposes_what_followed_the_last_ngram(tokens, proposal):
    assert NgramProposer(k=3, min_n=1, max_n=3).propose(tokens) == proposal


def test_the_longest_match_is_tried_first():
    tokens = [5, 1, 2, 3, 6, 9, 3, 7, 1, 2, 3]  # "3" last followed 7, but "1 2 3" followed by 6
    assert NgramProposer(k=2, min_n=1, max_n=3).propose(tokens) == (6, 9)
    assert NgramProposer(k=2, min_n=1, max_n=1).propose(tokens) == (7, 1)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="min_n <= max_n"):
        NgramProposer(k=2, min_n=3, max_n=2)


def test_a_sequences_token_history_is_its_prompt_and_output_as_they_grow(tiny_tokenizer):
    from handler.engine.sequence import Sequence
    from handler.request import GenerationRequest, TokenChoice

    prompt = tiny_tokenizer("the cat sat")["input_ids"]
    sequence = Sequence(GenerationRequest("the cat sat", 50, ignore_eos=True), prompt, tiny_tokenizer, frozenset({2}))
    assert sequence.token_history().tolist() == prompt
    taken: list[int] = []
    for step in range(1, 20):  # one token, then several a step: the buffer grows past its first size
        new = [100 + step + i for i in range(step % 3 + 1)]
        sequence.take(*(TokenChoice(t) for t in new))
        taken += new
        assert sequence.token_history().tolist() == [*prompt, *taken]
