"""Pick and load the configured backend."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from handler.backends.base import Backend
from handler.config import ConfigError, ServingConfig

logger = logging.getLogger(__name__)


def load_backend(config: ServingConfig, model_dir: str | Path | None, context: Any = None) -> Backend:
    """`context` (TorchServe's) gives neuronx this worker's gpu_id and the worker count."""
    backend = _load(config, model_dir, context)
    if backend.n_slots != config.scheduler.n_slots:
        slots = backend.n_slots
        backend.close()
        raise ConfigError(
            f"model-config.yaml: scheduler.n_slots ({config.scheduler.n_slots}) does not match the {backend.name} "
            f"model's {slots} slots (its compiled batch size); set scheduler.n_slots: {slots}"
        )
    return backend


def _load(config: ServingConfig, model_dir: str | Path | None, context: Any) -> Backend:
    from handler.neuron.auto import resolve_auto, worker_of

    config = resolve_auto(config)
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

        return HFBackend(handler, checkpoint, config.scheduler.n_slots)
    if handler.backend == "sim":
        from handler.backends.sim import SimBackend

        return SimBackend(handler, checkpoint, model_dir)
    if handler.backend == "neuronx":
        from handler.backends.neuronx import NeuronxBackend

        return NeuronxBackend(config, checkpoint, *worker_of(context))
    raise ConfigError(f"model-config.yaml: handler.backend: unknown backend {handler.backend!r}")
