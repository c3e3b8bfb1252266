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


@dataclass(frozen=True)
class NgramProposer:
    k: int  # tokens proposed at most (num_speculative_tokens)
    min_n: int = 2  # prompt_lookup_min
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

    def propose(self, tokens: Sequence[int] | np.ndarray) -> tuple[int, ...]:
        """Up to `k` tokens to verify after `tokens` (the row's prompt and output so far). Only the
        earlier places of the last token are candidates; each longer n keeps those whose n - 1
        tokens before also match, so a step costs one pass over the text, not one per n."""
        ids = np.asarray(tokens, dtype=np.int64)
        if len(ids) < 2:
            return ()
        ends = np.flatnonzero(ids[:-1] == ids[-1])  # where an earlier n-gram would end (its last token)
        for n in range(min(self.max_n, len(ids) - 1), self.min_n - 1, -1):
            matching = ends[ends >= n - 1]
            for back in range(1, n):
                matching = matching[ids[matching - back] == ids[-1 - back]]
            if matching.size:
                start = int(matching[-1]) + 1  # what followed the most recent earlier occurrence
                return tuple(int(t) for t in ids[start : start + self.k])
        return ()
