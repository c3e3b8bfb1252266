"""Incremental detokenization: token ids in, text deltas out.

Decoding each new token on its own breaks text: SentencePiece drops a word's leading
space at the start of a decode, and a byte-level BPE splits one emoji or CJK character
over several tokens. So we decode a short window (prefix offset .. end) and emit only
what it adds beyond the already-emitted part of the same window, holding back text
that still ends in an incomplete UTF-8 sequence (U+FFFD) until the next token
completes it. The deltas concatenate to exactly the decoded completion.

The window must stay short, or every step decodes more than the last. A run of tokens that
add no text would grow it without bound: special tokens (decoded as nothing), or text that
keeps ending in U+FFFD (a model looping on a lone byte token). So once a run is long, the
special tokens decode skips are dropped from it (no decode changes), and, for a byte-level
BPE, the part of the text no later byte can change is sent and the window restarted after
it. (SentencePiece byte fallback decodes a whole run of byte tokens at once, as text or as
all U+FFFD, so no part of such a run is settled before it ends: it is held as before.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"
# Tokens of context decoded before the first generated token, so its leading space
# (or byte continuation) decodes as it would inside the full text.
PROMPT_CONTEXT_TOKENS = 4
# Tokens held back (adding no text, or text ending in U+FFFD) before the run is shortened;
# the last TAIL_TOKENS stay held, enough bytes to finish any UTF-8 character.
HELD_TOKENS_LIMIT = 8
TAIL_TOKENS = 4


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


def decodes_utf8_per_subpart(tokenizer: Any) -> bool:
    """A byte-level BPE decodes its bytes as UTF-8 with one U+FFFD per maximal invalid subpart,
    so a U+FFFD followed by any further character is final, and decoding from any token on
    agrees with the whole from the first non-continuation byte."""
    try:
        from tokenizers import decoders  # asked on a long held run only
    except ImportError:
        return False
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    return isinstance(decoder, decoders.ByteLevel)


def skipped_token_candidates(tokenizer: Any) -> frozenset[int]:
    """Ids `decode(skip_special_tokens=True)` may drop: the named special tokens and added ones
    marked special (a Llama-3 reserved token is the latter only)."""
    ids = set(getattr(tokenizer, "all_special_ids", ()))
    added = getattr(tokenizer, "added_tokens_decoder", {})
    ids.update(i for i, token in added.items() if getattr(token, "special", False))
    return frozenset(ids)


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._candidates: frozenset[int] | None = None  # built on the first long run only
        self._splittable: bool | None = None  # likewise
        self._skipped: dict[int, bool] = {}  # candidate id -> decodes to nothing

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            if len(self._ids) - self._read_offset > HELD_TOKENS_LIMIT:
                return self._shorten(prefix_text, full_text)
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta

    def _is_skipped(self, token_id: int) -> bool:
        """A special token decode drops: leaving it out of the window changes no decode."""
        if self._candidates is None:
            self._candidates = skipped_token_candidates(self._tokenizer)
        if token_id not in self._candidates:
            return False
        if token_id not in self._skipped:
            self._skipped[token_id] = self._decode([token_id]) == ""
        return self._skipped[token_id]

    def _shorten(self, prefix_text: str, full_text: str) -> str:
        """A long held run: drop its skipped special tokens, then send what has settled.

        Both texts stay valid: the dropped tokens decoded to nothing in any window.
        """
        held = self._ids[self._read_offset :]
        kept = [i for i in held if not self._is_skipped(i)]
        if len(kept) < len(held):
            self._ids[self._read_offset :] = kept
        if len(kept) <= HELD_TOKENS_LIMIT:
            return ""
        if self._splittable is None:
            self._splittable = decodes_utf8_per_subpart(self._tokenizer)
        return self._release_settled(prefix_text, full_text) if self._splittable else ""

    def _release_settled(self, prefix_text: str, full_text: str) -> str:
        """Send the run's text up to its last TAIL_TOKENS and restart the window there.

        Only when that is provably what waiting would send: the head is a prefix of the full
        text and more text follows it (so its last character is finished, however it ends),
        and a window starting just before the split decodes non-empty context plus the same
        rest. Otherwise keep holding, as before.
        """
        split = len(self._ids) - TAIL_TOKENS
        head = self._decode(self._ids[self._prefix_offset : split])
        if len(head) < len(prefix_text) or len(full_text) <= len(head) or not full_text.startswith(head):
            return ""
        start = split - PROMPT_CONTEXT_TOKENS
        context = self._decode(self._ids[start:split])
        if not context or self._decode(self._ids[start:]) != context + full_text[len(head) :]:
            return ""
        self._prefix_offset, self._read_offset = start, split
        return head[len(prefix_text) :]

    def flush(self) -> str:
        """Text still held back at the end of generation (e.g. a truncated UTF-8 sequence)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]
