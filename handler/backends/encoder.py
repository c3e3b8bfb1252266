"""The `hf` encoder: a sentence-transformers checkpoint (BERT family and any encoder AutoModel loads)
on CPU, turning token ids into sentence embeddings. No slots, no steps: one call embeds a batch.

`encode` right-pads the rows to the longest, masks the padding, runs the model once and pools
(handler/backends/pooling.py) as the checkpoint's sentence-transformers config says
(handler/backends/sentence_config.py). Padding is masked, so a row's vector does not depend on
its batch-mates (up to float rounding). The tokenizer, limits and padding are shared with the
neuronx encoder (handler/backends/encoder_base.py).
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModel

from handler.backends.encoder_base import SentenceEncoder
from handler.backends.hf import load_model
from handler.backends.pooling import l2_normalize, pool
from handler.config import HandlerConfig

logger = logging.getLogger(__name__)


class HFEncoder(SentenceEncoder):
    name = "hf"

    def __init__(self, config: HandlerConfig, checkpoint: Path) -> None:
        if config.cpu_threads is not None:
            torch.set_num_threads(config.cpu_threads)
        folder = self._read_text(checkpoint, config.trust_remote_code)
        self.model = load_model(AutoModel, folder, config)
        self._read_limits(self.model.config, self.model.get_input_embeddings().num_embeddings)
        self._token_types = "token_type_ids" in inspect.signature(self.model.forward).parameters
        self._log_ready(type(self.model).__name__)

    def encode(self, rows: Sequence[Sequence[int]]) -> torch.Tensor:
        """[len(rows), dimension] float32 sentence embeddings of token-id rows (each 1..max_length
        ids), in one forward."""
        if not rows:
            return torch.empty((0, self.dimension), dtype=torch.float32)
        self._check_rows(rows)
        ids, mask = self.padded(rows, max(len(row) for row in rows))
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
