"""Prompt-lookup proposals (vLLM's and transformers' "ngram" speculation, docs/speculative.md): a
row's next tokens guessed by finding its last n tokens earlier in its own text (prompt and output so
far) and proposing what followed them there. It costs no model and pays off where output copies
from the input: extraction, summaries, edits of code or documents, RAG answers, tool arguments.

The longest suffix is tried first (from `max_n` down to `min_n`), and its most recent earlier
occurrence wins: the nearest context is the likeliest to repeat. Up to `k` tokens are proposed,
fewer when the match runs into the end of the text; none when nothing matches.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


@dataclass(frozen=True)
class NgramProposer:
    k: int  # tokens proposed at most (num_speculative_tokens)
    min_n: int = 1  # prompt_lookup_min
    max_n: int = 4  # prompt_lookup_max

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n or self.k < 1:
            raise ValueError(f"ngram speculation needs 1 <= min_n <= max_n and k >= 1, not {self}")

    @classmethod
    def of(cls, settings: Any) -> NgramProposer | None:
        """From `scheduler.speculation` (read by attribute: the engine imports no config); None
        when speculation is off."""
        if settings is None:
            return None
        return cls(settings.num_speculative_tokens, settings.prompt_lookup_min, settings.prompt_lookup_max)

    def propose(self, tokens: Sequence[int]) -> tuple[int, ...]:
        """Up to `k` tokens to verify after `tokens` (the row's prompt and output so far)."""
        ids = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            suffix = ids[-n:]
            windows = sliding_window_view(ids[:-1], n)  # every n-gram that ends before the last token
            hits = np.flatnonzero((windows == suffix).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # what followed the most recent earlier occurrence
                return tuple(int(t) for t in ids[start : start + self.k])
        return ()
