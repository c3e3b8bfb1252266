"""What the Neuron LLM backends (neuronx, nxdi) share on top of the device lifecycle
(handler/backends/device_backend.py): the checkpoint's facts, default buckets, the slots of a
compiled batch with the checks the step contract's calls must pass against them, and
`SlotDeviceBackend`, the start-up sequence and the slot bookkeeping both run. Both SDKs corrupt
a live slot's KV when a decode leaves it out, so a decode must name every live slot; both
compile fixed positions and prompt buckets."""

from __future__ import annotations

import time
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import AutoConfig

from handler.backends.base import Backend, clamp_n_positions
from handler.backends.device_backend import DeviceBackend
from handler.backends.host_sampling import HostSampling
from handler.backends.memory_fit import amp_dtype, check_memory_fit, weight_dtype
from handler.backends.tokenizer import eos_token_ids, load_tokenizer
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.neuron.memory import Layout, LoraLayout
from handler.request import GenerationRequest, SlotRequest


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


class SlotDeviceBackend(DeviceBackend, Backend):
    """An LLM compiled for NeuronCores with `n_slots` sequence slots, driven a step at a time.
    Start-up, in order: the checkpoint's facts, the buckets (`_plan_buckets`, the SDK's), the
    host sampler, the memory-fit check (before any core is claimed or the model loads), the live
    slots, then the device lifecycle (placement, load or compile). The SDK subclass adds its
    prefill, decode and warm-up calls; release and close are the same for both."""

    decode_trap: str  # what the SDK does to a live slot a decode leaves out (said when one is refused)
    context_buckets: list[int]  # the compiled prompt lengths; the largest is the longest prompt

    def __init__(
        self,
        config: ServingConfig,
        checkpoint: Path,
        gpu_id: int | None = None,
        workers: int = 1,
        cores: Sequence[int] | None = None,
    ) -> None:
        handler = config.handler
        self.settings = getattr(handler, self.name)  # its section: handler.neuronx, handler.nxdi
        self.checkpoint = checkpoint
        self.tp_degree = handler.tp_degree
        self.amp = handler.amp
        self.n_slots = config.scheduler.n_slots
        facts = CheckpointFacts.read(checkpoint, handler.trust_remote_code, handler.n_positions)
        self.tokenizer, self.hf_config = facts.tokenizer, facts.hf_config
        self.eos_token_ids, self.vocab_size, self.n_positions = facts.eos_token_ids, facts.vocab_size, facts.n_positions
        self.context_buckets = self._plan_buckets()
        self.max_prompt_tokens = self.context_buckets[-1]
        self.sampling = HostSampling(
            self.n_slots, self.eos_token_ids, self.n_positions, self.tokenizer, self.vocab_size
        )
        if self.settings.memory_check:  # before any core is claimed or the model loads
            layout = Layout(
                self.tp_degree,
                self.n_slots,
                self.n_positions,
                weight_dtype(self.amp, self._int8_weights()),
                amp_dtype(self.amp),
                gqa=self._gqa(),
                sdk=self.name,
                lora=self._lora_memory(),
            )
            check_memory_fit(self.name, checkpoint, layout)
        self._live = LiveSlots(self.name, self.n_slots, self.n_positions, self.decode_trap)
        self._place_and_start(gpu_id, workers, cores)

    # -- the SDK's part of the start ------------------------------------------------------
    @abstractmethod
    def _plan_buckets(self) -> list[int]:
        """The context buckets (with `_checked_buckets`), after any other bucket the SDK compiles."""

    @abstractmethod
    def _int8_weights(self) -> bool:
        """Whether the configuration quantizes the weights to int8 (for the memory check)."""

    def _gqa(self) -> str | None:
        """The SDK's group-query-attention sharding (for the memory check); None: its default."""
        return None

    def _lora_memory(self) -> LoraLayout | None:
        """The LoRA adapters the SDK keeps in device memory (for the memory check); None: none."""
        return None

    def _checked_buckets(self, configured: list[int] | None, key: str) -> list[int]:
        """`handler.<name>.<key>`, or powers of two up to n_positions; none may exceed n_positions."""
        buckets = configured or default_buckets(self.n_positions)
        if buckets[-1] > self.n_positions:
            raise ConfigError(
                f"model-config.yaml: handler.{self.name}.{key}: bucket {buckets[-1]} is above n_positions "
                f"({self.n_positions}); keep every bucket <= n_positions"
            )
        return buckets

    # -- serving ---------------------------------------------------------------------------
    @property
    def samples_on_host(self) -> bool:
        """Whether the host picks the tokens (`self.sampling`; the device returns logits). When it
        does not, the layer is still built and released per slot, but never asked for a token."""
        return True

    @property
    def sampling_s(self) -> float:
        return self.sampling.seconds if self.samples_on_host else 0.0

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        return self.sampling.refusal(request)

    def release(self, slot: int) -> None:
        self._live.pop(slot, None)
        self.sampling.release(slot)

    def warmup(self) -> None:
        """With host sampling the sampler's grammar masks are built first, whatever `warmup` says
        (host work, seconds at most); then `_warm_up`, the SDK's calls, unless `warmup` is off.
        Every slot is free again afterwards, whether it worked or not."""
        if self.samples_on_host:
            self.sampling.warmup()
        if not self.settings.warmup:
            return
        started = time.perf_counter()
        try:
            what = self._warm_up()
        finally:
            for slot in range(self.n_slots):
                self.release(slot)
        self._logger.info("%s: warm-up %s in %.1f s", self.name, what, time.perf_counter() - started)

    @abstractmethod
    def _warm_up(self) -> str:
        """Run each compiled kernel once through the step contract; what ran, for the log line."""

    def close(self) -> None:
        for slot in list(self._live):
            self.release(slot)
        super().close()
