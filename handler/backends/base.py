"""The contract every backend (hf, neuronx, sim) fulfils."""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from handler.protocol import SamplingParams

logger = logging.getLogger(__name__)


def clamp_n_positions(wanted: int, limit: int | None, what: str) -> int:
    """The configured n_positions, or less (with a warning) when the model allows fewer."""
    if limit is None or wanted <= limit:
        return wanted
    logger.warning("n_positions %d is above the %s's %d positions; using %d", wanted, what, limit, limit)
    return limit


@dataclass(frozen=True)
class RowSpec:
    """One row of a micro-batch, as the backend sees it."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    ignore_eos: bool = False


class Backend(ABC):
    """A loaded model that generates a micro-batch at a time.

    `generate` must call `streamer.put(prompt_ids)` once, then `streamer.put(tokens)`
    with one token per row for each step, and may stop early once
    `is_finished(row)` is true for every row. The caller ends the streamer.
    """

    name: str
    tokenizer: Any
    n_positions: int
    eos_token_ids: frozenset[int]

    @property
    def static_batch_size(self) -> int | None:
        """The compiled batch size of a static-shape model; None where any size runs."""
        return None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    @abstractmethod
    def generate(self, rows: Sequence[RowSpec], streamer: Any, is_finished: Callable[[int], bool]) -> None: ...

    def warmup(self) -> None:
        """Run whatever the first real request would otherwise pay for."""

    def close(self) -> None:
        """Release the model."""
