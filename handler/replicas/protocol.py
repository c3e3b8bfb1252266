"""The messages between a worker and its replica processes (pickled over a socket pair)."""

from __future__ import annotations

from dataclasses import dataclass, field

from handler.config import ServingConfig
from handler.engine.sequence import Progress
from handler.engine.step_engine import StepRecord
from handler.request import GenerationRequest

# The (logprobs, prompt_logprobs) combinations a request can ask for, answered once at start.
LOGPROB_ASKS = ((True, False), (False, True), (True, True))


@dataclass(frozen=True)
class ReplicaSpec:
    """What a replica process needs to load its model copy."""

    index: int
    config: ServingConfig
    model_dir: str | None
    cores: tuple[int, ...] | None = None  # neuronx: this replica's NeuronCores, claimed by the worker


@dataclass(frozen=True)
class ModelFacts:
    """What the worker needs to know of the model to parse, tokenize and check requests."""

    name: str
    n_slots: int
    n_positions: int
    max_prompt_tokens: int | None
    vocab_size: int | None
    eos_token_ids: frozenset[int]
    logprob_refusals: dict[tuple[bool, bool], str | None] = field(default_factory=dict)
    device_sampling_topk: int | None = None  # nxdi with on-device sampling: its global_topk


# -- worker to replica -----------------------------------------------------------------
@dataclass(frozen=True)
class Submit:
    request_id: str
    request: GenerationRequest
    prompt_ids: tuple[int, ...]
    received_at: float  # perf_counter: CLOCK_MONOTONIC, one clock for every process of the host


@dataclass(frozen=True)
class Abort:
    request_id: str


@dataclass(frozen=True)
class Stop:
    pass


# -- replica to worker -----------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    facts: ModelFacts
    pid: int
    load_s: float


@dataclass(frozen=True)
class StartFailed:
    cause: str


@dataclass(frozen=True)
class Stepped:
    """After one step: every sequence that produced text or ended, the step's records, and the
    slot gauges."""

    progress: tuple[Progress, ...]
    records: tuple[StepRecord, ...]
    occupied: int
    waiting: int
