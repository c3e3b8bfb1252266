import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from handler.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "hello world, the end",  # spaces
    "你好，世界。今天天气很好",  # CJK: several byte-level tokens per character
    "emoji 😀 then 👍🏽 and 🇫🇷 flags",  # 4-byte sequences and modifiers split across tokens
    "mixed: café 東京 🚀 done\n\nnext line",
]


@pytest.fixture(scope="module")
def sentencepiece_like():
    """A Llama-2-style tokenizer: Metaspace + byte fallback, and a decoder that strips the leading space."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=specials, show_progress=False)
    tok.train_from_iterator(["hello world this is a test", "the world is big and the end is near"], trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>")


def stream(tokenizer, prompt: str, completion: str) -> tuple[list[str], list[int]]:
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    ids = tokenizer(prompt + completion, add_special_tokens=False)["input_ids"][len(prompt_ids) :]
    detok = IncrementalDetokenizer(tokenizer, prompt_ids)
    return [detok.add(i) for i in ids] + [detok.flush()], ids


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_deltas_concatenate_to_the_decoded_completion(tiny_tokenizer, text):
    deltas, ids = stream(tiny_tokenizer, "Prompt:", " " + text)
    assert "".join(deltas) == tiny_tokenizer.decode(ids)
    assert not any("\ufffd" in d for d in deltas), deltas  # no half characters on the wire


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_leading_spaces_and_byte_fallback(sentencepiece_like, text):
    deltas, ids = stream(sentencepiece_like, "the", " " + text)
    full = sentencepiece_like.decode(
        sentencepiece_like("the", add_special_tokens=False)["input_ids"] + ids, skip_special_tokens=True
    )
    assert "".join(deltas) == full[len("the") :]
    assert not any("\ufffd" in d for d in deltas), deltas


def test_naive_per_token_decoding_would_lose_spaces(sentencepiece_like):
    """Guards the test above: the tokenizer really has the problem the detokenizer solves."""
    ids = sentencepiece_like(" hello world", add_special_tokens=False)["input_ids"]
    naive = "".join(sentencepiece_like.decode([i]) for i in ids)
    assert naive != sentencepiece_like.decode(ids)


def test_incomplete_utf8_is_held_then_flushed(tiny_tokenizer):
    ids = tiny_tokenizer("😀", add_special_tokens=False)["input_ids"]
    assert len(ids) > 1
    detok = IncrementalDetokenizer(tiny_tokenizer, [])
    assert [detok.add(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert detok.add(ids[-1]) == "😀"
    truncated = IncrementalDetokenizer(tiny_tokenizer, [])
    truncated.add(ids[0])
    assert truncated.flush() == "\ufffd"  # a generation that ends mid-character still ends
