"""The `hf` backend: transformers on CPU, the reference and the embedded default."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from handler.backends.base import clamp_n_positions
from handler.backends.generate_backend import GenerateBackend
from handler.config import HandlerConfig

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
# transformers 4.56 renamed `torch_dtype=` to `dtype=`; Neuron environments pin 4.4x.
_MAJOR_MINOR = tuple(int(part) for part in transformers.__version__.split(".")[:2])
DTYPE_KWARG = "dtype" if _MAJOR_MINOR >= (4, 56) else "torch_dtype"


def load_tokenizer(checkpoint: Path, trust_remote_code: bool):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:  # Llama-2 ships none; padding rows are masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def eos_token_ids(model_config, tokenizer) -> frozenset[int]:
    ids = getattr(model_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    return frozenset(int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None)


class HFBackend(GenerateBackend):
    name = "hf"

    def __init__(self, config: HandlerConfig, checkpoint: Path) -> None:
        if config.cpu_threads is not None:
            # On a small host the model's threads compete with the TorchServe frontend and the
            # clients; leaving them a core can serve more tokens/s, not fewer.
            torch.set_num_threads(config.cpu_threads)
            logger.info("hf: torch intra-op threads set to %d", config.cpu_threads)
        self.tokenizer = load_tokenizer(checkpoint, config.trust_remote_code)
        self.generation_model = AutoModelForCausalLM.from_pretrained(
            checkpoint,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=config.trust_remote_code,
            **{DTYPE_KWARG: TORCH_DTYPES[config.amp]},
        ).eval()
        self.pad_token_id = self.tokenizer.pad_token_id
        self.eos_token_ids = eos_token_ids(self.generation_model.config, self.tokenizer)
        max_positions = getattr(self.generation_model.config, "max_position_embeddings", None)
        self.n_positions = clamp_n_positions(config.n_positions, max_positions, "model")
