"""The memory-fit check a device backend (neuronx, nxdi) and the sim backend run at start, before
they load or compile anything: the configured layout against a NeuronCore's HBM
(handler/neuron/memory.py), nxdi's LoRA adapters included. A layout that cannot fit fails the
start with the numbers and what would fit; one within 5 % of the limit is logged as a warning."""

from __future__ import annotations

import logging
from pathlib import Path

from handler.errors import ConfigError
from handler.neuron.lora import LoraSettings
from handler.neuron.memory import Layout, LoraLayout, MemoryEstimate, ModelShape, estimate, fit_advice

logger = logging.getLogger(__name__)

# handler.amp (transformers-neuronx's spelling) -> the memory model's dtype names
AMP_DTYPES = {"f32": "f32", "f16": "fp16", "bf16": "bf16"}
SKIP_HINT = {
    "neuronx": "handler.neuronx.memory_check: false",
    "nxdi": "handler.nxdi.memory_check: false",
    "sim": "remove handler.sim.hf_config",
}


def check_memory_fit(backend: str, config_path: Path, layout: Layout, required: bool = False) -> MemoryEstimate | None:
    """The estimate for `layout` of the model whose config.json is at `config_path` (a checkpoint
    directory or the file); ConfigError, naming the keys to change, when it cannot fit. A config
    the memory model cannot read (not a dense Llama-style decoder: GPT-2's keys, a mixture of
    experts) skips the check with a warning, unless `required` (the sim's explicit hf_config)."""
    try:
        shape = ModelShape.from_path(config_path)
    except ConfigError as exc:
        if required:
            raise
        logger.warning("%s: memory check skipped: %s", backend, exc)
        return None
    found = estimate(shape, layout)
    if not found.fits:
        lora = (
            ", or, for the LoRA adapters, handler.lora.max_lora_rank, fewer adapters or "
            "handler.nxdi.dynamic_multi_lora (then handler.lora.max_loras of them in device memory)"
            if layout.lora is not None
            else ""
        )
        raise ConfigError(
            f"model-config.yaml: backend {backend}: this layout does not fit in a NeuronCore's memory, so it would "
            f"fail to allocate after loading (or compiling): {found.explain()}; {fit_advice(shape, layout)}. Change "
            f"handler.tp_degree, scheduler.n_slots or handler.n_positions{lora} (the estimate: "
            f"handler/neuron/memory.py; to skip the check, {SKIP_HINT.get(backend, 'skip it')})"
        )
    if found.near_limit:
        logger.warning(
            "%s: memory check: %s, within 5 %% of the limit (the runtime reserve is an estimate): the model may fail "
            "to allocate; a larger tp_degree or fewer slots or positions leave room",
            backend,
            found.explain(),
        )
    else:
        logger.info("%s: memory check: %s", backend, found.explain())
    return found


def amp_dtype(amp: str) -> str:
    """handler.amp in the memory model's spelling: the KV cache's dtype and the weights' unless int8."""
    return AMP_DTYPES.get(amp, amp)


def weight_dtype(amp: str, int8: bool = False) -> str:
    return "int8" if int8 else amp_dtype(amp)


def nxdi_lora_layout(lora: LoraSettings | None, dynamic: bool) -> LoraLayout | None:
    """The LoRA adapters nxdi compiles into device memory (as NxdiLoraLayout.build gives them to NxDI):
    every adapter and the base adapter, or with dynamic multi-LoRA max_loras of them and the base, the
    rest in host memory; each padded to max_lora_rank (a higher rank is refused at start)."""
    if lora is None:
        return None
    places = (lora.max_loras if dynamic else len(lora.adapters)) + 1
    return LoraLayout(places, lora.max_lora_rank)
