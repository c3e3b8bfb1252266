"""Tokenizer helpers every backend shares."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer


def load_tokenizer(checkpoint: Path, trust_remote_code: bool):
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, local_files_only=True, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:  # Llama-2 ships none; padding rows are masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def eos_token_ids(model_config, tokenizer) -> frozenset[int]:
    ids = getattr(model_config, "eos_token_id", None)
    ids = ids if isinstance(ids, list) else [ids]
    return frozenset(int(i) for i in [*ids, tokenizer.eos_token_id] if i is not None)
