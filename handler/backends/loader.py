"""Pick and load the configured backend."""

from __future__ import annotations

import logging
from pathlib import Path

from handler.backends.base import Backend
from handler.config import ConfigError, ServingConfig

logger = logging.getLogger(__name__)


def load_backend(config: ServingConfig, model_dir: str | Path | None) -> Backend:
    handler = config.handler
    checkpoint = handler.checkpoint_path(model_dir or ".")
    if not checkpoint.is_dir():
        raise ConfigError(
            f"model-config.yaml: handler.model_checkpoint_dir: {checkpoint} is not a directory; point it at a local "
            "Hugging Face checkpoint (absolute, or relative to the model archive)"
        )
    logger.info("loading backend %s from %s", handler.backend, checkpoint)
    if handler.backend == "hf":
        from handler.backends.hf import HFBackend

        return HFBackend(handler, checkpoint)
    raise ConfigError(f"model-config.yaml: handler.backend: unknown backend {handler.backend!r}")
