"""What the Neuron backends (neuronx, nxdi) share: the checkpoint's facts, the SDK versions a
manifest records, default buckets, this process's NeuronCores, and the slots of a compiled
batch with the checks the step contract's calls must pass against them. Both SDKs corrupt a
live slot's KV when a decode leaves it out, so a decode must name every live slot; both
compile fixed positions and prompt buckets."""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from handler.backends.base import clamp_n_positions
from handler.backends.tokenizer import eos_token_ids, load_tokenizer
from handler.neuron.cores import CorePlacement, claim
from handler.neuron.environment import pin_cores
from handler.request import SlotRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointFacts:
    """What a Neuron backend reads of the Hugging Face checkpoint before it compiles or loads."""

    tokenizer: Any
    hf_config: Any
    eos_token_ids: frozenset[int]
    vocab_size: int | None
    n_positions: int  # the configured one, clamped to the model's max_position_embeddings

    @classmethod
    def read(cls, checkpoint: Path, trust_remote_code: bool, n_positions: int) -> CheckpointFacts:
        tokenizer = load_tokenizer(checkpoint, trust_remote_code)
        hf_config = AutoConfig.from_pretrained(checkpoint, local_files_only=True)
        return cls(
            tokenizer,
            hf_config,
            eos_token_ids(hf_config, tokenizer),
            getattr(hf_config, "vocab_size", None),
            clamp_n_positions(n_positions, getattr(hf_config, "max_position_embeddings", None), "model"),
        )


def default_buckets(n_positions: int) -> list[int]:
    """Buckets: powers of two from 128 up to n_positions (which is always the last)."""
    buckets, size = [], 128
    while size < n_positions:
        buckets.append(size)
        size *= 2
    return [*buckets, n_positions]


def package_version(distribution: str, module: Any) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return getattr(module, "__version__", None)


def compiler_version() -> str | None:
    try:
        return package_version("neuronx-cc", importlib.import_module("neuronxcc"))
    except ImportError:
        return None


def place_process(
    backend: str, tp_degree: int, num_cores: int | None, gpu_id: int | None, workers: int, cores: Sequence[int] | None
) -> CorePlacement:
    """This process's NeuronCores, pinned before the SDK is imported: `cores` when its worker gave
    a replica some (the worker holds their locks), else claimed here (handler/neuron/cores.py)."""
    if cores is not None:
        placement, within = CorePlacement(tuple(cores), "given by this replica's worker"), "the worker's cores"
    else:
        placement, within = claim(gpu_id, workers, tp_degree, num_cores)
    pin_cores(placement.visible_cores)
    logger.info(
        "%s: NeuronCores %s for this process (%s; %d worker(s) x tp_degree %d within %s)",
        backend,
        placement.visible_cores,
        placement.how,
        workers,
        tp_degree,
        within,
    )
    return placement


@dataclass
class LiveSlot:
    """A live sequence: the token it chose last, and the position that token goes to (= how many
    positions of the slot's KV hold its sequence)."""

    token: int
    position: int


class LiveSlots(dict[int, LiveSlot]):
    """The live slots of a compiled batch of `n_slots`, by slot."""

    def __init__(self, backend: str, n_slots: int, n_positions: int, trap: str) -> None:
        super().__init__()
        self.backend, self.n_slots, self.n_positions = backend, n_slots, n_positions
        self.trap = trap  # what the SDK does to a live slot a decode leaves out

    def check_prefill(self, requests: Sequence[SlotRequest], buckets: Sequence[int]) -> None:
        slots = [request.slot for request in requests]
        if len(set(slots)) != len(slots):
            raise ValueError(f"{self.backend} prefill: a slot appears twice in {slots}")
        for request in requests:
            if not 0 <= request.slot < self.n_slots:
                raise ValueError(f"{self.backend} prefill: slot {request.slot} is not one of the {self.n_slots} slots")
            if request.slot in self:
                raise ValueError(f"{self.backend} prefill: slot {request.slot} is live; release it first")
            if not 1 <= len(request.prompt_ids) <= buckets[-1]:
                raise ValueError(
                    f"{self.backend} prefill: a prompt of {len(request.prompt_ids)} tokens; the compiled context "
                    f"buckets {list(buckets)} take 1 to {buckets[-1]}"
                )

    def check_decode(self, slots: Sequence[int]) -> list[LiveSlot]:
        """The slots' states, in `slots` order; refuses a call that is not every live slot exactly
        once, or that would write beyond the compiled positions."""
        if len(set(slots)) != len(slots) or set(slots) != set(self):
            raise ValueError(
                f"{self.backend} decode must name every live slot exactly once: got {list(slots)}, live "
                f"{sorted(self)} ({self.trap})"
            )
        states = [self[slot] for slot in slots]
        for slot, state in zip(slots, states, strict=True):
            if state.position >= self.n_positions:
                raise ValueError(
                    f"{self.backend} slot {slot}: its next token would go to position {state.position}, beyond the "
                    f"{self.n_positions} compiled positions (n_positions): the request outran prompt + "
                    "max_new_tokens"
                )
        return states
