"""Issue 45's exactness rules before any backend uses them: the acceptance of proposed tokens keeps
the distribution of one-token decoding (chi-square over 20,000 draws on a small vocabulary, fixed
seed, against the target itself and against sampling a two-token chain one token at a time), greedy
acceptance is the argmax prefix, and prompt lookup proposes what followed the last n-gram."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from handler.engine.ngram import NgramProposer
from handler.sampling.speculative import accept_greedy, accept_sampled

DRAWS = 20_000
ALPHA = 1e-3  # a correct rule fails this 1 time in 1,000; a biased one (tests below) fails always


def counts(values: list[int], size: int) -> np.ndarray:
    return np.bincount(np.asarray(values), minlength=size)


def expected(probs: torch.Tensor) -> np.ndarray:
    """DRAWS times the distribution, in float64 summing to DRAWS (chisquare checks the totals agree)."""
    p = probs.double().numpy()
    return DRAWS * p / p.sum()


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
    assert accept_greedy(proposal, argmax) == taken


def test_greedy_needs_one_more_target_token_than_proposals():
    with pytest.raises(ValueError, match="2 proposals need 3 target tokens"):
        accept_greedy((1, 2), (1, 2))


# -- sampled: one position -----------------------------------------------------------------------
P = torch.tensor([0.05, 0.4, 0.25, 0.2, 0.1])


@pytest.mark.parametrize("proposed", [0, 1, 3])
def test_a_proposed_token_comes_out_with_exactly_the_targets_distribution(proposed: int):
    generator = torch.Generator().manual_seed(1234 + proposed)
    probs = torch.stack([P, torch.full((5,), 0.2)])  # the bonus position's distribution is irrelevant here
    firsts = [accept_sampled((proposed,), probs, generator)[0] for _ in range(DRAWS)]
    assert chisquare(counts(firsts, 5), expected(P)).pvalue > ALPHA


def test_the_test_sees_a_biased_rule():
    """The same check on a rule that always accepts: it must fail, or the test above proves nothing."""
    generator = torch.Generator().manual_seed(7)
    biased = [
        1 if torch.rand((), generator=generator) < 0.7 else int(torch.multinomial(P, 1, generator=generator))
        for _ in range(DRAWS)
    ]
    assert chisquare(counts(biased, 5), expected(P)).pvalue < ALPHA


# -- sampled: a chain ----------------------------------------------------------------------------
# A toy model over 4 tokens: the next token's distribution given the last one.
TRANSITIONS = torch.tensor(
    [
        [0.1, 0.6, 0.2, 0.1],
        [0.3, 0.1, 0.5, 0.1],
        [0.25, 0.25, 0.25, 0.25],
        [0.7, 0.1, 0.1, 0.1],
    ]
)


def test_two_tokens_by_speculation_have_the_joint_distribution_of_one_at_a_time():
    """From token 0, propose (1, 2): the two tokens that come out (the first position, then the
    second or the correction's follower) are distributed as the chain's own two steps."""
    generator = torch.Generator().manual_seed(99)
    pairs = []
    for _ in range(DRAWS):
        probs = torch.stack([TRANSITIONS[0], TRANSITIONS[1], TRANSITIONS[2]])  # given 0; given 0,1; given 0,1,2
        taken = accept_sampled((1, 2), probs, generator)
        if len(taken) == 1:  # rejected at once: the second token is the next step, one at a time
            taken.append(int(torch.multinomial(TRANSITIONS[taken[0]], 1, generator=generator)))
        pairs.append(taken[0] * 4 + taken[1])
    joint = (TRANSITIONS[0][:, None] * TRANSITIONS).reshape(-1)
    assert chisquare(counts(pairs, 16), expected(joint)).pvalue > ALPHA


def test_a_seeded_row_repeats_itself():
    probs = torch.stack([P, P, P])
    runs = [accept_sampled((1, 2), probs, torch.Generator().manual_seed(5)) for _ in range(3)]
    assert runs[0] == runs[1] == runs[2]


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
