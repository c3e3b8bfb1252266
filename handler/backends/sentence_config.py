"""What a sentence-transformers checkpoint says about its embeddings, read from its files, so that
any such encoder serves as sentence-transformers' own `encode` would:

- `modules.json`: the pipeline: a Transformer (its folder: "" or e.g. `0_Transformer`), a Pooling
  module (its folder's `config.json` picks the mode) and, optionally, Normalize (L2). A module this
  server cannot run (Dense, a custom one) is refused: silently skipping it would serve other vectors.
- `sentence_bert_config.json` (in the Transformer's folder): `max_seq_length`, `do_lower_case`.

A plain Hugging Face encoder (no modules.json) gets mean pooling and no normalisation, what
sentence-transformers itself does when it wraps one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.backends.pooling import PoolingMode
from handler.errors import ConfigError

_TRANSFORMER = "sentence_transformers.models.Transformer"
_POOLING = "sentence_transformers.models.Pooling"
_NORMALIZE = "sentence_transformers.models.Normalize"
# Pooling config.json's switches, and the `pooling_mode` string newer releases also accept.
_SWITCHES: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
_NAMES: dict[str, PoolingMode] = {"cls": "cls", "mean": "mean", "max": "max", "lasttoken": "lasttoken"}
_UNSUPPORTED_SWITCHES = ("pooling_mode_weightedmean_tokens",)


@dataclass(frozen=True)
class SentenceConfig:
    transformer_dir: Path  # the folder holding the encoder's config.json, weights and tokenizer
    pooling: PoolingMode
    normalize: bool
    max_seq_length: int | None = None
    do_lower_case: bool = False
    dimension: int | None = None  # the pooling config's word_embedding_dimension, when it gives one


def read_sentence_config(checkpoint: Path) -> SentenceConfig:
    modules_file = checkpoint / "modules.json"
    if not modules_file.is_file():
        return SentenceConfig(checkpoint, "mean", False, *_bert_config(checkpoint))
    modules = _json(modules_file)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ConfigError(f"{modules_file}: expected a list of modules")
    transformer_dir: Path | None = None
    pooling: tuple[PoolingMode, int | None] | None = None
    normalize = False
    for module in sorted(modules, key=lambda m: m.get("idx", 0)):
        kind, folder = str(module.get("type", "")), checkpoint / str(module.get("path", ""))
        if kind == _TRANSFORMER and transformer_dir is None:
            transformer_dir = folder
        elif kind == _POOLING and pooling is None and transformer_dir is not None:
            pooling = _pooling(folder / "config.json")
        elif kind == _NORMALIZE and pooling is not None:
            normalize = True
        else:
            raise ConfigError(
                f"{modules_file}: module {module.get('name', '?')} ({kind or 'no type'}) is not supported here: this "
                "server runs Transformer, then Pooling, then optionally Normalize; it would serve other vectors than "
                "sentence-transformers does"
            )
    if transformer_dir is None or pooling is None:
        raise ConfigError(f"{modules_file}: needs a Transformer module followed by a Pooling module")
    max_seq_length, lower = _bert_config(transformer_dir)
    return SentenceConfig(transformer_dir, pooling[0], normalize, max_seq_length, lower, pooling[1])


def _pooling(path: Path) -> tuple[PoolingMode, int | None]:
    if not path.is_file():
        raise ConfigError(f"{path}: the Pooling module's config is missing")
    config = _json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    dimension = config.get("word_embedding_dimension")
    dimension = dimension if isinstance(dimension, int) else None
    for switch in _UNSUPPORTED_SWITCHES:
        if config.get(switch):
            raise ConfigError(f"{path}: {switch} is not supported by this server")
    named = config.get("pooling_mode")
    if isinstance(named, str):
        if named not in _NAMES:
            raise ConfigError(f"{path}: pooling_mode {named!r} is not supported; known: {', '.join(_NAMES)}")
        return _NAMES[named], dimension
    chosen = [mode for switch, mode in _SWITCHES.items() if config.get(switch)]
    if len(chosen) != 1:
        raise ConfigError(
            f"{path}: exactly one pooling mode must be on (got {chosen or 'none'}); this server does not "
            "concatenate several"
        )
    return chosen[0], dimension


def _bert_config(folder: Path) -> tuple[int | None, bool]:
    path = folder / "sentence_bert_config.json"
    if not path.is_file():
        return None, False
    config = _json(path)
    if not isinstance(config, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    length = config.get("max_seq_length")
    return (length if isinstance(length, int) and length > 0 else None), bool(config.get("do_lower_case"))


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot be read as JSON: {exc}") from None
