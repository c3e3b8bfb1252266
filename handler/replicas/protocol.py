"""The messages between a worker and its replica processes (pickled over a socket pair)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from handler.config import ServingConfig
from handler.engine.sequence import Progress
from handler.engine.step_engine import StepRecord
from handler.request import Constraint, GenerationRequest, SamplingParams

# The (logprobs, prompt_logprobs) combinations a request can ask for, answered once at start.
LOGPROB_ASKS = ((True, False), (False, True), (True, True))


def _probe(sampling: SamplingParams | None = None, constraint: Constraint | None = None) -> GenerationRequest:
    return GenerationRequest("probe", 1, sampling or SamplingParams(), constraint=constraint)


# The request fields a backend refuses whatever their value (sim: logit_bias; a sampler without
# grammars: constraint; nxdi's on-device sampler: the penalties, ...): each as a request asking
# for it alone, answered once at start, and whether a request asks for it. top_k, refused above a
# bound, goes by ModelFacts.device_sampling_topk.
FIELD_ASKS: dict[str, tuple[GenerationRequest, Callable[[GenerationRequest], bool]]] = {
    "seed": (
        _probe(SamplingParams(do_sample=True, seed=1)),
        lambda r: r.sampling.seed is not None and r.sampling.seed_from_client,
    ),
    "repetition_penalty": (
        _probe(SamplingParams(repetition_penalty=1.1)),
        lambda r: r.sampling.repetition_penalty != 1,
    ),
    "presence_penalty": (_probe(SamplingParams(presence_penalty=0.5)), lambda r: r.sampling.presence_penalty != 0),
    "frequency_penalty": (_probe(SamplingParams(frequency_penalty=0.5)), lambda r: r.sampling.frequency_penalty != 0),
    "logit_bias": (_probe(SamplingParams(logit_bias=((0, 1.0),))), lambda r: bool(r.sampling.logit_bias)),
    "min_tokens": (_probe(SamplingParams(min_tokens=1)), lambda r: r.sampling.min_tokens > 0),
    "constraint": (_probe(constraint=Constraint("json_object")), lambda r: r.constraint is not None),
}


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
    field_refusals: dict[str, tuple[str, str] | None] = field(default_factory=dict)  # by FIELD_ASKS
    adapter_refusals: dict[bool, str | None] = field(default_factory=dict)  # runtime_adapter_refusal(unload)


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


@dataclass(frozen=True)
class LoadAdapter:
    """Check and load a LoRA adapter between steps; answered with AdapterLoaded."""

    name: str
    path: str
    max_rank: int


@dataclass(frozen=True)
class UnloadAdapter:
    """Forget a LoRA adapter once no sequence names it."""

    name: str


# -- replica to worker -----------------------------------------------------------------
@dataclass(frozen=True)
class Ready:
    facts: ModelFacts
    pid: int
    load_s: float


@dataclass(frozen=True)
class AdapterLoaded:
    name: str
    error: str | None  # why the load failed; None: it is loaded


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
