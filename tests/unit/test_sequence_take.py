"""`Sequence.take` with several tokens at once (a backend that decodes more than one token per row
per step): exactly what taking them one at a time gives, joined, and nothing of the tokens after
the one that ended the sequence."""

from __future__ import annotations

import random

import pytest

from handler.engine.sequence import FinishReason, Sequence, State
from handler.request import GenerationRequest, SamplingParams, TokenChoice

EOS = 1


class CharTokenizer:
    """One character per token id (its code point); EOS (1) decodes to nothing."""

    def decode(self, ids, skip_special_tokens=True, **_):
        return "".join(chr(i) for i in ids if i > EOS)


def char_sequence(max_new_tokens: int = 64, **kwargs) -> Sequence:
    request = GenerationRequest("a", max_new_tokens, **kwargs)
    return Sequence(request, [ord("a")], CharTokenizer(), frozenset({EOS}), "r")


def chars(text: str, logprob: float | None = None) -> list[TokenChoice]:
    return [TokenChoice(ord(c), logprob, ((ord(c), logprob),) if logprob is not None else ()) for c in text]


def state_of(sequence: Sequence) -> tuple:
    error = None if sequence.error is None else (type(sequence.error), sequence.error.message, sequence.error.param)
    return (
        sequence.state,
        sequence.finish_reason,
        error,
        sequence.completion_tokens,
        list(sequence.token_ids),
        list(sequence.text),
        list(sequence.choices),
        sequence.prompt_logprobs,
        sequence.full_text,
    )


def one_by_one(sequence: Sequence, groups: list[list[TokenChoice]]) -> list[str]:
    """Per group: the deltas of its tokens taken one at a time (as a 1-token engine would), joined;
    nothing is taken once the sequence ended."""
    out = []
    for group in groups:
        deltas = []
        for choice in group:
            if sequence.finished:
                break
            deltas.append(sequence.take(choice))
        out.append("".join(deltas))
    return out


def grouped(sequence: Sequence, groups: list[list[TokenChoice]]) -> list[str]:
    return [sequence.take(*group) for group in groups]


def assert_same(make, groups: list[list[TokenChoice]]) -> Sequence:
    single, several = make(), make()
    assert grouped(several, groups) == one_by_one(single, groups)
    assert state_of(several) == state_of(single)
    return several


# -- the cases one by one -------------------------------------------------------------------
def test_several_plain_tokens_give_the_text_of_all():
    sequence = char_sequence()
    assert sequence.take(*chars("hel")) == "hel"
    assert sequence.take(*chars("lo")) == "lo"
    assert (sequence.completion_tokens, sequence.full_text, sequence.finished) == (5, "hello", False)
    assert sequence.take() == ""  # no tokens: nothing changes
    assert sequence.completion_tokens == 5


def test_a_stop_string_completed_by_the_second_of_three_tokens_ends_there():
    sequence = char_sequence(stop=("lo",), logprobs=1)
    assert sequence.take(*chars("hel", -0.5)) == "he"  # "l" could begin the stop string: held back
    assert sequence.take(*chars("lo!", -0.25)) == "l"  # "lo" completes it; "!" is not taken
    assert sequence.finish_reason is FinishReason.STOP and sequence.full_text == "hel"
    assert sequence.completion_tokens == 5 and sequence.token_ids == [ord(c) for c in "hello"]
    assert [c.token_id for c in sequence.choices] == [ord(c) for c in "hello"]  # logprobs of taken tokens only


def test_a_stop_string_across_two_tokens_of_one_step():
    make = lambda: char_sequence(stop=("xy",))  # noqa: E731
    sequence = assert_same(make, [chars("ab"), chars("cxyz"), chars("more")])
    assert (sequence.full_text, sequence.completion_tokens) == ("abc", 5)  # "z" and the next step: not taken


def test_eos_in_the_middle_ends_there():
    sequence = char_sequence(logprobs=0)
    text = sequence.take(*chars("ab", -1.0), TokenChoice(EOS, -2.0), *chars("cd", -1.0))
    assert text == "ab" and sequence.finish_reason is FinishReason.EOS
    assert sequence.token_ids == [ord("a"), ord("b"), EOS] and sequence.completion_tokens == 3
    assert len(sequence.choices) == 3


def test_ignore_eos_takes_eos_as_a_plain_token():
    make = lambda: char_sequence(ignore_eos=True, max_new_tokens=6)  # noqa: E731
    sequence = assert_same(make, [[*chars("ab"), TokenChoice(EOS), *chars("cdef")]])
    assert sequence.finish_reason is FinishReason.LENGTH and sequence.completion_tokens == 6


def test_a_stop_token_id_in_the_middle_ends_there():
    sequence = char_sequence(stop_token_ids=(ord("!"),))
    assert sequence.take(*chars("hi!there")) == "hi"
    assert sequence.finish_reason is FinishReason.STOP and sequence.token_ids[-1] == ord("!")
    assert sequence.completion_tokens == 3


def test_max_new_tokens_cuts_inside_the_list():
    sequence = char_sequence(max_new_tokens=4)
    assert sequence.take(*chars("ab")) == "ab"
    assert sequence.take(*chars("cdef")) == "cd"
    assert sequence.finish_reason is FinishReason.LENGTH and sequence.completion_tokens == 4
    assert sequence.tokens_left == 0
    assert sequence.take(*chars("gh")) == "" and sequence.completion_tokens == 4  # ended: nothing taken


def test_a_constraint_failure_fails_the_sequence_at_that_token():
    sequence = char_sequence(logprobs=0)
    failing = TokenChoice(EOS, -0.1, constraint_failure="the grammar gave up")
    assert sequence.take(*chars("ab", -1.0), failing, *chars("cd", -1.0)) == "ab"
    assert sequence.state is State.FAILED and sequence.error.param == "constraint"
    assert sequence.token_ids == [ord("a"), ord("b")] and sequence.completion_tokens == 2
    assert sequence.choices[-1] is failing and len(sequence.choices) == 3  # as one at a time keeps it


def test_min_tokens_holds_the_stop_string_until_reached_inside_one_list():
    make = lambda: char_sequence(stop=("x",), sampling=SamplingParams(min_tokens=3))  # noqa: E731
    sequence = assert_same(make, [chars("xaxbx")])
    assert sequence.full_text == "xa" and sequence.completion_tokens == 3
    assert sequence.finish_reason is FinishReason.STOP


def test_the_prompt_logprobs_of_a_prefill_choice_are_kept():
    sequence = char_sequence()
    from handler.request import PromptTokenLogprob

    prompt = (PromptTokenLogprob(ord("a"), None),)
    sequence.take(TokenChoice(ord("b"), prompt=prompt), *chars("c"))
    assert sequence.prompt_logprobs == prompt


def test_tokens_left_counts_down():
    sequence = char_sequence(max_new_tokens=5)
    assert sequence.tokens_left == 5
    sequence.take(*chars("abc"))
    assert sequence.tokens_left == 2


# -- any tokens, any grouping: the same as one at a time ----------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_random_groupings_with_the_tiny_tokenizer_give_what_one_at_a_time_gives(tiny_tokenizer, seed):
    """Byte-level BPE tokens (held-back partial characters included), stops of every kind, logprobs:
    any split of the same token stream into steps of 1 to 4 tokens gives the same deltas per step and
    the same end."""
    rng = random.Random(seed)
    eos = tiny_tokenizer.eos_token_id
    ended_inside_a_step = 0
    words = "the cat sat on a mat, énorme 東京 🙂 and then stop here. done!".split()
    for _ in range(40):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        ids = tiny_tokenizer(text, add_special_tokens=False)["input_ids"]
        if rng.random() < 0.3:
            ids.insert(rng.randrange(len(ids) + 1), eos)
        choices = [TokenChoice(t, -0.5 * (i + 1), ((t, -0.5),)) for i, t in enumerate(ids)]
        if rng.random() < 0.15:
            at = rng.randrange(len(choices))
            choices[at] = TokenChoice(choices[at].token_id, constraint_failure="gave up")
        kwargs: dict = {
            "max_new_tokens": rng.randint(1, len(ids) + 2),
            "logprobs": rng.choice([None, 0, 2]),
            "ignore_eos": rng.random() < 0.2,
            "sampling": SamplingParams(min_tokens=rng.choice([0, 0, 2, 5])),
        }
        if rng.random() < 0.6:
            kwargs["stop"] = tuple(rng.sample(["stop", "at", "t t", "東", "🙂 a", "e. d", "xyz"], rng.randint(1, 3)))
        if rng.random() < 0.3:
            kwargs["stop_token_ids"] = (rng.choice(ids),)
        request = GenerationRequest(text, **kwargs)
        groups, i = [], 0
        while i < len(choices):
            n = rng.randint(1, 4)
            groups.append(choices[i : i + n])
            i += n

        def make(request=request) -> Sequence:
            return Sequence(request, [5, 6, 7], tiny_tokenizer, frozenset({eos}), "r")

        sequence = assert_same(make, groups)
        taken = sequence.completion_tokens + (sequence.state is State.FAILED)  # a failing token is not counted
        ends = {sum(len(g) for g in groups[: k + 1]) for k in range(len(groups))}
        ended_inside_a_step += sequence.finished and taken not in ends
    assert ended_inside_a_step >= 5  # the case that matters was there
