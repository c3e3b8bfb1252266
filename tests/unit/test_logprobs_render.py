"""handler/api/logprobs.py: token texts and offsets that index the response text (special tokens
take no room), the chosen token among the alternatives, and streamed slices that add up to the
whole."""

from __future__ import annotations

from handler.api.logprobs import TokenLog
from handler.api.openai import legacy_logprobs
from handler.engine.sequence import Sequence
from handler.request import GenerationRequest, PromptTokenLogprob, TokenChoice

PROMPT = "Today the weather is"


def sequence(tokenizer, generated_text: str = " nice and warm", eos: bool = True) -> tuple[Sequence, list[int]]:
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    request = GenerationRequest(prompt=PROMPT, max_new_tokens=50, logprobs=1, prompt_logprobs=True)
    seq = Sequence(request, prompt_ids, tokenizer, frozenset({tokenizer.eos_token_id}))
    generated = tokenizer(generated_text, add_special_tokens=False)["input_ids"]
    if eos:
        generated.append(tokenizer.eos_token_id)
    prompt = tuple(
        PromptTokenLogprob(t, None if i == 0 else -1.0 - i, () if i == 0 else ((7, -0.5),))
        for i, t in enumerate(prompt_ids)
    )
    for j, token in enumerate(generated):
        choice = TokenChoice(token, -0.25 * (j + 1), ((token, -0.25 * (j + 1)),) if j % 2 else ((9, -0.1),))
        seq.take(choice if j else TokenChoice(choice.token_id, choice.logprob, choice.top_logprobs, prompt))
    return seq, generated


def test_offsets_index_the_echoed_text_and_specials_take_no_room(tiny_tokenizer):
    seq, generated = sequence(tiny_tokenizer)
    tokens = TokenLog().take(seq, text_sent=None, with_prompt=True, echo_offset=len(PROMPT))
    assert len(tokens) == len(seq.prompt_ids) + len(generated)  # EOS included
    text = PROMPT + seq.full_text
    special = set(tiny_tokenizer.all_special_ids)
    for token in tokens:
        if token.token_id in special:
            assert token.end == token.offset
        else:
            assert text[token.offset : token.end] == token.text
    assert tokens[-1].text == tiny_tokenizer.decode([tiny_tokenizer.eos_token_id])  # shown, e.g. '</s>'


def test_legacy_object_holds_the_chosen_token_among_the_alternatives(tiny_tokenizer):
    seq, _ = sequence(tiny_tokenizer)
    tokens = TokenLog().take(seq, text_sent=None, with_prompt=True, echo_offset=len(PROMPT))
    lp = legacy_logprobs(tokens)
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for token_text, logprob, top in zip(
        lp["tokens"][1:], lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True
    ):
        assert top[token_text] == logprob  # the same float in both places
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])


def test_streamed_slices_follow_the_text_sent_and_add_up(tiny_tokenizer):
    seq, generated = sequence(tiny_tokenizer, eos=False)
    whole = [t.token_id for t in TokenLog().take(seq, text_sent=None, with_prompt=False)]
    log = TokenLog()  # one response's: the same Sequence may be rendered by another
    first = log.take(seq, text_sent=log.sent(""), with_prompt=False)
    assert first == []  # no text sent yet: no generated token may go
    pieces = [first]
    for character in seq.full_text[:-1]:
        pieces.append(log.take(seq, text_sent=log.sent(character), with_prompt=False))
    pieces.append(log.take(seq, text_sent=None, with_prompt=False))
    assert [t.token_id for piece in pieces for t in piece] == whole == generated
    assert pieces[-1] and pieces[-1][-1].token_id == generated[-1]  # its text was not all sent before the end
