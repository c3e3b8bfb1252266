"""Pick and load the configured backend. Plain values in: the serving layer reads TorchServe's
context (this worker's gpu_id, the model's worker count) and passes them here."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from handler.backends.base import Backend
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.lora.adapters import AdapterError
from handler.neuron.auto import choose_backend, choose_encoder_backend
from handler.neuron.lora import LoraSettings

if TYPE_CHECKING:
    from handler.backends.encoder_base import SentenceEncoder

logger = logging.getLogger(__name__)


def load_backend(
    config: ServingConfig,
    model_dir: str | Path | None,
    gpu_id: int | None = None,
    workers: int = 1,
    cores: Sequence[int] | None = None,
) -> Backend:
    """`gpu_id` (TorchServe's, for this worker) and `workers` (the model's worker count) place
    neuronx on its NeuronCores; `cores` are a replica's, already claimed by its worker."""
    backend = _load(config, model_dir, gpu_id, workers, cores)
    if backend.n_slots != config.scheduler.n_slots:
        slots = backend.n_slots
        backend.close()
        raise ConfigError(
            f"model-config.yaml: scheduler.n_slots ({config.scheduler.n_slots}) does not match the {backend.name} "
            f"model's {slots} slots (its compiled batch size); set scheduler.n_slots: {slots}"
        )
    try:
        _install_adapters(backend, config, model_dir)
    except BaseException:
        backend.close()
        raise
    return backend


def nxdi_lora(config: ServingConfig, model_dir: str | Path | None) -> LoraSettings | None:
    """`handler.lora` as the nxdi backend compiles it in (None: no adapters)."""
    lora = config.handler.lora
    if lora is None or not lora.adapters:
        return None
    return LoraSettings.of(config.handler.adapter_paths(model_dir or "."), lora.max_loras, lora.max_lora_rank)


def _install_adapters(backend: Backend, config: ServingConfig, model_dir: str | Path | None) -> None:
    """`handler.lora.adapters`, each checked against the base model and loaded, or the start fails
    naming the adapter."""
    lora = config.handler.lora
    if lora is None or not lora.adapters:
        return
    if backend.lora_shapes() is None:
        raise ConfigError(
            f"model-config.yaml: handler.lora: the {backend.name} backend serves no LoRA adapters; use backend "
            "nxdi or hf"
        )
    for name, path in config.handler.adapter_paths(model_dir or ".").items():
        try:
            spec = backend.install_adapter(name, path, lora.max_lora_rank)
        except AdapterError as exc:
            raise ConfigError(f"model-config.yaml: handler.lora.adapters.{name}: {exc}") from exc
        logger.info(
            "LoRA adapter %s loaded (rank %d, %s) from %s", name, spec.rank, ", ".join(spec.target_modules), path
        )


def load_encoder(
    config: ServingConfig, model_dir: str | Path | None, gpu_id: int | None = None, workers: int = 1
) -> SentenceEncoder:
    """The encoder of an embedding archive (`handler.task: embed`): hf, neuronx, or auto resolved here
    (config.py refuses the others). `gpu_id` and `workers` place neuronx on this worker's NeuronCore."""
    config = resolve_auto(config)
    checkpoint = _checkpoint(config, model_dir)
    logger.info("loading the encoder (backend %s) from %s", config.handler.backend, checkpoint)
    if config.handler.backend == "neuronx":
        from handler.backends.encoder_neuron import NeuronEncoder

        return NeuronEncoder(config, checkpoint, gpu_id, workers)
    from handler.backends.encoder import HFEncoder

    return HFEncoder(config.handler, checkpoint)


def resolve_auto(config: ServingConfig, dev_dir: Path = Path("/dev")) -> ServingConfig:
    """The same config with `backend: auto` replaced by the backend chosen here (logged)."""
    if config.handler.backend != "auto":
        return config
    chosen, why = choose_encoder_backend(dev_dir) if config.handler.task == "embed" else choose_backend(dev_dir)
    logger.info("backend auto: using %s (%s)", chosen, why)
    handler = config.handler.model_copy(update={"backend": chosen})
    return config.model_copy(update={"handler": handler})


def _load(
    config: ServingConfig,
    model_dir: str | Path | None,
    gpu_id: int | None,
    workers: int,
    cores: Sequence[int] | None,
) -> Backend:
    config = resolve_auto(config)
    handler = config.handler
    checkpoint = _checkpoint(config, model_dir)
    logger.info("loading backend %s from %s", handler.backend, checkpoint)
    if handler.backend == "hf":
        from handler.backends.hf import HFBackend

        speculation = config.scheduler.speculation
        k = speculation.num_speculative_tokens if speculation is not None else 0
        return HFBackend(handler, checkpoint, config.scheduler.n_slots, speculative_tokens=k)
    if handler.backend == "sim":
        from handler.backends.sim import SimBackend

        speculation = config.scheduler.speculation  # the sim models the proposer and the verify
        k = speculation.num_speculative_tokens if speculation is not None else 0
        return SimBackend(handler, checkpoint, model_dir, speculative_tokens=k)
    if handler.backend == "neuronx":
        from handler.backends.neuronx import NeuronxBackend

        return NeuronxBackend(config, checkpoint, gpu_id, workers, cores)
    if handler.backend == "nxdi":
        from handler.backends.nxdi import NxdiBackend

        speculation = handler.nxdi.speculation  # EAGLE: the draft, relative to the archive like the checkpoint
        draft = speculation.draft_path(model_dir or ".") if speculation is not None else None
        return NxdiBackend(config, checkpoint, gpu_id, workers, cores, lora=nxdi_lora(config, model_dir), draft=draft)
    raise ConfigError(f"model-config.yaml: handler.backend: unknown backend {handler.backend!r}")


def _checkpoint(config: ServingConfig, model_dir: str | Path | None) -> Path:
    checkpoint = config.handler.checkpoint_path(model_dir or ".")
    if not checkpoint.is_dir():
        raise ConfigError(
            f"model-config.yaml: handler.model_checkpoint_dir: {checkpoint} is not a directory; point it at a local "
            "Hugging Face checkpoint (absolute, or relative to the model archive)"
        )
    return checkpoint
