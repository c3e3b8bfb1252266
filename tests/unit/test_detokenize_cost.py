"""Per-token host work must not grow with the tokens generated so far: each `Sequence.take`
decodes a short window, never the whole completion. Checked structurally (how many ids each
`decode` call is given), not by timing, so it holds on a noisy machine; the timed view is
scripts/bench/detokenize.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from handler.engine.detokenizer import IncrementalDetokenizer
from handler.engine.sequence import FinishReason, Sequence
from handler.request import GenerationRequest, TokenChoice

CORPUS = Path(__file__).resolve().parents[2] / "scripts" / "model" / "corpus.txt"
WINDOW_BOUND = 16  # ids in one decode call: context + a held run, whatever the length so far


class CountingTokenizer:
    """The real tokenizer, recording the size of every id list `decode` is given."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.calls: list[int] = []

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        self.calls.append(len(ids))
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)


def text_ids(tokenizer: Any, n: int) -> list[int]:
    ids = tokenizer(CORPUS.read_text().replace("#", ""), add_special_tokens=False)["input_ids"]
    return [ids[i % len(ids)] for i in range(n)]


def lone_byte_token(tokenizer: Any) -> int:
    """A token whose repetition never makes valid UTF-8 (the text always ends in U+FFFD)."""
    return next(i for i in range(len(tokenizer)) if tokenizer.decode([i] * 8) == "\ufffd" * 8)


def decode_sizes_per_take(tokenizer: Any, ids: list[int], stop: tuple[str, ...] = ()) -> list[list[int]]:
    """For each take, the sizes of the id lists decoded during it."""
    counting = CountingTokenizer(tokenizer)
    request = GenerationRequest(prompt="", max_new_tokens=len(ids) + 1, stop=stop, ignore_eos=True)
    seq = Sequence(request, text_ids(tokenizer, 200), counting, frozenset({tokenizer.eos_token_id}))
    per_take = []
    for token_id in ids:
        counting.calls.clear()
        seq.take(TokenChoice(token_id))
        per_take.append(list(counting.calls))
    assert not seq.finished
    return per_take


def assert_bounded(per_take: list[list[int]]) -> None:
    """A few short decodes per take, and no more ids decoded per take at 1000 tokens than at 50."""
    assert max(len(calls) for calls in per_take) <= 5
    assert max(max(calls, default=0) for calls in per_take) <= WINDOW_BOUND
    near_50, near_1000 = per_take[40:60], per_take[-20:]
    assert max(map(sum, near_1000)) <= max(map(sum, near_50))


def test_ordinary_text_decodes_a_short_window_at_any_length(tiny_tokenizer):
    assert_bounded(decode_sizes_per_take(tiny_tokenizer, text_ids(tiny_tokenizer, 1000), ("###", "\n\nUser:")))


def test_a_run_of_special_tokens_does_not_grow_the_window(tiny_tokenizer):
    special = next(i for i in tiny_tokenizer.all_special_ids if i != tiny_tokenizer.eos_token_id)
    assert_bounded(decode_sizes_per_take(tiny_tokenizer, text_ids(tiny_tokenizer, 10) + [special] * 990))


def test_a_lone_byte_loop_does_not_grow_the_window(tiny_tokenizer):
    byte = lone_byte_token(tiny_tokenizer)
    assert_bounded(decode_sizes_per_take(tiny_tokenizer, text_ids(tiny_tokenizer, 10) + [byte] * 990))


def stream(tokenizer: Any, prompt_ids: list[int], ids: list[int]) -> list[str]:
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.add(i) for i in ids] + [detok.flush()]


def test_deltas_after_a_long_byte_run_still_concatenate_to_the_decode(tiny_tokenizer):
    prompt = tiny_tokenizer("Prompt:", add_special_tokens=False)["input_ids"]
    byte = lone_byte_token(tiny_tokenizer)
    tail = tiny_tokenizer(" then 😀 and 你好", add_special_tokens=False)["input_ids"]
    special = tiny_tokenizer.all_special_ids[0]
    ids = [byte] * 40 + [special] * 20 + tail + [byte] * 30 + tail
    deltas = stream(tiny_tokenizer, prompt, ids)
    full = tiny_tokenizer.decode(prompt + ids, skip_special_tokens=True)[len(tiny_tokenizer.decode(prompt)) :]
    assert "".join(deltas) == full
    sent = ""
    for delta in deltas:  # nothing sent is ever taken back: no half character went out as U+FFFD
        sent += delta
        assert full.startswith(sent)
    assert any(deltas[:40]), "the settled part of the byte run is sent before the run ends"


@pytest.fixture(scope="module")
def byte_fallback():
    """SentencePiece byte fallback with ordinary byte tokens: a run of them decodes together."""
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"<0x{i:02X}>": 3 + i for i in range(256)}
    for word in ["▁", "▁hello", "▁world"]:
        vocab[word] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def test_a_byte_fallback_run_is_held_whole(byte_fallback):
    """One bad byte makes the whole run U+FFFD however it continues, so none of it may be cut."""
    byte = {i: byte_fallback.convert_tokens_to_ids(f"<0x{i:02X}>") for i in (0xD9, 0xE3, 0x81, 0x82)}
    ids = [byte[0xD9]] + [byte[0xE3], byte[0x81], byte[0x82]] * 5 + [byte_fallback.convert_tokens_to_ids("▁world")]
    prompt = [byte_fallback.convert_tokens_to_ids("▁hello")]
    deltas = stream(byte_fallback, prompt, ids)
    assert deltas[:-2] == [""] * (len(ids) - 1)
    assert "".join(deltas) == "\ufffd" * 16 + " world"


def test_stop_string_across_tokens_after_a_long_run(tiny_tokenizer):
    byte = lone_byte_token(tiny_tokenizer)
    stop_ids = tiny_tokenizer("a ## then # and ###tail", add_special_tokens=False)["input_ids"]
    assert len(stop_ids) > 4
    request = GenerationRequest(prompt="", max_new_tokens=500, stop=("###",), ignore_eos=True)
    prompt = tiny_tokenizer("Prompt:", add_special_tokens=False)["input_ids"]
    seq = Sequence(request, prompt, tiny_tokenizer, frozenset({tiny_tokenizer.eos_token_id}))
    sent = []
    for token_id in [byte] * 30 + text_ids(tiny_tokenizer, 300) + stop_ids:
        sent.append(seq.take(TokenChoice(token_id)))
        if seq.finished:
            break
    assert seq.finish_reason is FinishReason.STOP
    assert len(sent) == 30 + 300 + stop_ids.index(tiny_tokenizer.convert_tokens_to_ids("#"), 9) + 3
    assert seq.full_text.endswith("a ## then # and ")  # "##" and "#" were held, then sent
    assert "".join(sent) == seq.full_text and "###" not in seq.full_text
