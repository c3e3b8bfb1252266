"""Incremental detokenization: token ids in, text deltas out.

Decoding each new token on its own breaks text: SentencePiece drops a word's leading
space at the start of a decode, and a byte-level BPE splits one emoji or CJK character
over several tokens. So we decode a short window (prefix offset .. end) and emit only
what it adds beyond the already-emitted part of the same window, holding back text
that still ends in an incomplete UTF-8 sequence (U+FFFD) until the next token
completes it. The deltas concatenate to exactly the decoded completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# Tokens of context decoded before the first generated token, so its leading space
# (or byte continuation) decodes as it would inside the full text.
PROMPT_CONTEXT_TOKENS = 4


class Decoder(Protocol):
    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, prompt_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        context = list(prompt_ids[-PROMPT_CONTEXT_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_id: int) -> str:
        """Append one generated token; return the text it completes (may be empty)."""
        self._ids.append(token_id)
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return delta

    def flush(self) -> str:
        """Text still held back at the end of generation (e.g. a truncated UTF-8 sequence)."""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full_text = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full_text[len(prefix_text) :]
