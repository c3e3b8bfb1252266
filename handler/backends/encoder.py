"""The `hf` encoder: a sentence-transformers checkpoint (BERT family and any encoder AutoModel loads)
on CPU, turning token ids into sentence embeddings. No slots, no steps: one call embeds a batch.

`encode` right-pads the rows to the longest, masks the padding, runs the model once and pools
(handler/backends/pooling.py) as the checkpoint's sentence-transformers config says
(handler/backends/sentence_config.py). Padding is masked, so a row's vector does not depend on
its batch-mates (up to float rounding).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModel

from handler.backends.hf import load_model
from handler.backends.pooling import l2_normalize, pool
from handler.backends.sentence_config import read_sentence_config
from handler.backends.tokenizer import load_tokenizer
from handler.config import HandlerConfig
from handler.errors import ConfigError

logger = logging.getLogger(__name__)

# A tokenizer's model_max_length above this is transformers' "no limit" placeholder.
_NO_LIMIT = 1_000_000


class HFEncoder:
    name = "hf"

    def __init__(self, config: HandlerConfig, checkpoint: Path) -> None:
        if config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        self.sentence = read_sentence_config(checkpoint)
        folder = self.sentence.transformer_dir
        self.tokenizer = load_tokenizer(folder, config.trust_remote_code)
        self.model = load_model(AutoModel, folder, config)
        model_config = self.model.config
        if getattr(model_config, "is_decoder", False) and self.sentence.pooling != "lasttoken":
            logger.warning("encoder: %s is a decoder; its embeddings pool with %s", folder, self.sentence.pooling)
        self.dimension = int(model_config.hidden_size)
        if self.sentence.dimension is not None and self.sentence.dimension != self.dimension:
            raise ConfigError(
                f"{folder}: the Pooling module expects {self.sentence.dimension} dimensions, the model gives "
                f"{self.dimension}"
            )
        self.max_length = _max_length(self.sentence.max_seq_length, self.tokenizer, model_config)
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad) if pad is not None else 0
        self._token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        logger.info(
            "encoder: %s, %d dimensions, pooling %s%s, at most %d tokens per input",
            type(self.model).__name__,
            self.dimension,
            self.sentence.pooling,
            " + L2 normalisation" if self.sentence.normalize else "",
            self.max_length,
        )

    def tokenize(self, text: str) -> list[int]:
        """The input's token ids as the model reads them (special tokens added), never truncated: a
        call without truncation or padding arguments truncates nothing, and changes none of the
        shared tokenizer's settings (a tokenizer.json with built-in truncation has it cleared by the
        first call, the warm-up's, before any request)."""
        if self.sentence.do_lower_case:
            text = text.lower()
        return list(self.tokenizer(text, add_special_tokens=True, verbose=False)["input_ids"])

    def encode(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[len(rows), dimension] float32 sentence embeddings of token-id rows (each 1..max_length
        ids), in one forward."""
        if not rows:
            return torch.empty((0, self.dimension), dtype=torch.float32)
        width = max(len(row) for row in rows)
        if min(len(row) for row in rows) < 1 or width > self.max_length:
            raise ValueError(f"encode: every row needs 1..{self.max_length} token ids")
        ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(list(row), dtype=torch.long)
            mask[i, : len(row)] = 1
        inputs = {"input_ids": ids, "attention_mask": mask}
        if self._token_types:
            inputs["token_type_ids"] = torch.zeros_like(ids)
        with torch.inference_mode():
            hidden = self.model(**inputs).last_hidden_state
            vectors = pool(hidden, mask, self.sentence.pooling)
            if self.sentence.normalize:
                vectors = l2_normalize(vectors)
        return vectors.float()

    def warmup(self) -> None:
        self.encode([self.tokenize("Hello, world")[: self.max_length]])

    def close(self) -> None:
        self.model = None


def _max_length(configured: int | None, tokenizer, model_config) -> int:
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
