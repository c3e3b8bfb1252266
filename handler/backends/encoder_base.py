"""What every encoder backend shares, whatever runs the model: the checkpoint's sentence-transformers
config, its tokenizer, the limits read from the model's config (dimension, longest input, vocabulary)
and the padded id/mask tensors a forward takes. The hf encoder (handler/backends/encoder.py) and the
neuronx encoder (handler/backends/encoder_neuron.py) differ only in how they run those tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from handler.backends.sentence_config import SentenceConfig, read_sentence_config
from handler.backends.tokenizer import load_tokenizer
from handler.errors import ConfigError

logger = logging.getLogger(__name__)

# A tokenizer's model_max_length above this is transformers' "no limit" placeholder.
_NO_LIMIT = 1_000_000


class SentenceEncoder:
    """The surface the embedding adapter uses: tokenize, encode(rows) -> [n, dimension], warmup, close,
    .dimension, .max_length, .vocab_size, .tokenizer, .name."""

    name: str
    sentence: SentenceConfig
    dimension: int
    max_length: int
    vocab_size: int
    pad_token_id: int

    def _read_text(self, checkpoint: Path, trust_remote_code: bool) -> Path:
        """The sentence config and the tokenizer; returns the folder of the transformer module."""
        self.sentence = read_sentence_config(checkpoint)
        folder = self.sentence.transformer_dir
        self.tokenizer = load_tokenizer(folder, trust_remote_code)
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        return folder

    def _read_limits(self, model_config: Any, vocab_size: int) -> None:
        folder = self.sentence.transformer_dir
        if getattr(model_config, "is_decoder", False) and self.sentence.pooling != "lasttoken":
            logger.warning("encoder: %s is a decoder; its embeddings pool with %s", folder, self.sentence.pooling)
        self.dimension = int(model_config.hidden_size)
        if self.sentence.dimension is not None and self.sentence.dimension != self.dimension:
            raise ConfigError(
                f"{folder}: the Pooling module expects {self.sentence.dimension} dimensions, the model gives "
                f"{self.dimension}"
            )
        self.max_length = model_max_length(self.sentence.max_seq_length, self.tokenizer, model_config)
        self.vocab_size = int(vocab_size)

    def tokenize(self, text: str) -> list[int]:
        """The input's token ids as the model reads them (special tokens added), never truncated: a
        call without truncation or padding arguments truncates nothing, and changes none of the
        shared tokenizer's settings (a tokenizer.json with built-in truncation has it cleared by the
        first call, the warm-up's, before any request)."""
        if self.sentence.do_lower_case:
            text = text.lower()
        return list(self.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"])

    def _check_rows(self, rows: Sequence[Sequence[int]]) -> None:
        if min(len(row) for row in rows) < 1 or max(len(row) for row in rows) > self.max_length:
            raise ValueError(f"encode: every row needs 1..{self.max_length} token ids")

    def padded(self, rows: Sequence[Sequence[int]], width: int, batch: int | None = None) -> tuple[torch.Tensor, ...]:
        """(ids, mask) of `batch` (default len(rows)) right-padded rows of `width`: mask 1 on real
        tokens. Filler rows past the real ones hold one unmasked pad token, so no row is all padding."""
        batch = len(rows) if batch is None else batch
        ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
            mask[i, : len(row)] = 1
        mask[len(rows) :, 0] = 1
        return ids, mask

    def _log_ready(self, what: str) -> None:
        logger.info(
            "encoder: %s, %d dimensions, pooling %s%s, at most %d tokens per input",
            what,
            self.dimension,
            self.sentence.pooling,
            " + L2 normalisation" if self.sentence.normalize else "",
            self.max_length,
        )


def model_max_length(configured: int | None, tokenizer: Any, model_config: Any) -> int:
    """The longest input the model embeds: sentence-transformers' max_seq_length, within the
    tokenizer's model_max_length and the model's position embeddings."""
    limits = [configured]
    tokenizer_limit = getattr(tokenizer, "model_max_length", None)
    if isinstance(tokenizer_limit, int) and 0 < tokenizer_limit < _NO_LIMIT:
        limits.append(tokenizer_limit)
    positions = getattr(model_config, "max_position_embeddings", None)
    if isinstance(positions, int) and positions > 0:
        limits.append(positions)
    known = [limit for limit in limits if limit]
    if not known:
        raise ConfigError("the encoder gives no maximum input length (max_seq_length, model_max_length)")
    return min(known)
