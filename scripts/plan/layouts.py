"""`make plan`'s search space: the instances (profiles/inf2-instances.yaml), the layouts one
checkpoint can take on each (tp_degree, replicas = cores // tp_degree, n_slots, n_positions,
prompt buckets), and which of them the memory model (handler/neuron/memory.py) rules out,
with the limit each one hits: HBM per NeuronCore, or host RAM to shard the checkpoint at load.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from handler.neuron.memory import HBM_PER_CORE_GIB, Layout, ModelShape, estimate, fit_advice, valid_tp_degrees

REPO = Path(__file__).resolve().parents[2]
INSTANCES_FILE = REPO / "profiles" / "inf2-instances.yaml"
SLOT_CHOICES = (1, 2, 4, 8, 16, 32, 64)
BUCKET_STEP = 64  # the largest prompt bucket is the longest prompt rounded up to this (a multiple of 8 for TP8)
POSITIONS_STEP = 512  # n_positions is rounded up to this: a round last decode bucket, at most 511 positions spare


@dataclass(frozen=True)
class Instance:
    name: str
    neuron_cores: int
    host_memory_gib: float
    usd_per_hour: float


@dataclass(frozen=True)
class Prices:
    """The instance table with its date and region (for the report)."""

    instances: dict[str, Instance]
    date: str
    region: str


def load_instances(path: Path = INSTANCES_FILE, overrides: dict[str, float] | None = None) -> Prices:
    raw = yaml.safe_load(path.read_text())
    found = {}
    for name, spec in raw["instances"].items():
        price = (overrides or {}).get(name, spec["usd_per_hour"])
        found[name] = Instance(name, spec["neuron_cores"], spec["host_memory_gib"], price)
    return Prices(found, str(raw.get("date", "")), str(raw.get("region", "")))


@dataclass(frozen=True)
class Workload:
    """What the plan is for: prompts of prompt_tokens (+- prompt_spread, normal), outputs of output_tokens."""

    prompt_tokens: int
    output_tokens: int
    prompt_spread: int = 0

    @property
    def longest_prompt(self) -> int:
        return self.prompt_tokens + 3 * self.prompt_spread

    @property
    def largest_bucket(self) -> int:
        return max(128, math.ceil(self.longest_prompt / BUCKET_STEP) * BUCKET_STEP)

    def n_positions(self, shape: ModelShape) -> int:
        """The largest prompt bucket plus the output, rounded up to a multiple of POSITIONS_STEP,
        within the model's max_position_embeddings. Not the next power of two: a 15,900-token
        prompt with 450 output tokens would then reserve KV for 32,768 positions, twice what it
        uses (the seed's TGI layout compiled 16,512)."""
        need = self.largest_bucket + self.output_tokens
        limit = shape.max_positions or need
        if need > limit:
            raise ValueError(
                f"{shape.name}: a {self.longest_prompt}-token prompt (bucket {self.largest_bucket}) and "
                f"{self.output_tokens} output tokens need {need} positions; the model has {limit} "
                "(max_position_embeddings)"
            )
        return min(math.ceil(need / POSITIONS_STEP) * POSITIONS_STEP, limit)

    def buckets(self) -> list[int]:
        """Prompt buckets (handler.neuronx.context_length_estimate): powers of two from 128 below the
        largest, then the largest (the longest prompt, rounded up to a multiple of 64)."""
        largest, size, out = self.largest_bucket, 128, []
        while size < largest:
            out.append(size)
            size *= 2
        return [*out, largest]


@dataclass(frozen=True)
class Candidate:
    instance: Instance
    tp_degree: int
    n_slots: int
    n_positions: int
    weight_dtype: str = "bf16"
    sdk: str = "neuronx"  # whose head padding applies (the backend of the snippet)

    @property
    def replicas(self) -> int:
        return self.instance.neuron_cores // self.tp_degree

    @property
    def layout(self) -> Layout:
        return Layout(
            tp_degree=self.tp_degree,
            n_slots=self.n_slots,
            n_positions=self.n_positions,
            weight_dtype=self.weight_dtype,
            sdk=self.sdk,
        )

    def label(self) -> str:
        return f"{self.instance.name} {self.replicas}x TP{self.tp_degree} x {self.n_slots} slots"


def candidates(
    shape: ModelShape,
    instances: Sequence[Instance],
    workload: Workload,
    slots: Sequence[int] = SLOT_CHOICES,
    weight_dtype: str = "bf16",
    sdk: str = "neuronx",
) -> list[Candidate]:
    n_positions = workload.n_positions(shape)
    return [
        Candidate(instance, tp, n, n_positions, weight_dtype, sdk)
        for instance in instances
        for tp in valid_tp_degrees(instance.neuron_cores)
        for n in slots
    ]


def fit_problem_of(shape: ModelShape, candidate: Candidate, presharded: bool = False) -> str | None:
    """Why the layout cannot load, or None: HBM per core (the memory estimate and its fit_advice),
    or host RAM: replica 0 loads alone, then the others together (handler/replicas), each
    sharding the checkpoint in host RAM. `presharded`: the weights load already sharded (nxdi's
    save_sharded_checkpoint, written by the compile, which can run on a larger host), so the
    host RAM to shard them is not the serving instance's limit."""
    found = estimate(shape, candidate.layout)
    if not found.fits:
        return (
            f"HBM per core at {candidate.n_slots} slot(s): {found.weights_gib:.1f} GiB weights + {found.kv_gib:.1f} "
            f"KV + {found.reserve_gib:.1f} reserve = {found.total_gib:.1f} > {found.hbm_gib:g} GiB; "
            f"{fit_advice(shape, candidate.layout)}"
        )
    if presharded:
        return None
    copies = max(1, candidate.replicas - 1)
    need = copies * found.host_shard_gib
    host = candidate.instance.host_memory_gib
    if need > host:
        return (
            f"host RAM: {copies} cop{'y' if copies == 1 else 'ies'} sharding the checkpoint at load need "
            f"{need:.1f} GiB > {host:g} GiB of {candidate.instance.name} (--backend nxdi loads pre-sharded "
            "weights: compile on a larger host, save_sharded_checkpoint)"
        )
    return None


def most_positions(shape: ModelShape, candidate: Candidate) -> int:
    """The most positions (the workload's n_positions doubled, again and again, up to the model's
    max) these slots fit in HBM at this tp."""
    best, size = candidate.n_positions, candidate.n_positions
    limit = shape.max_positions or candidate.n_positions
    while size < limit:
        size = min(size * 2, limit)
        layout = dataclasses.replace(candidate.layout, n_positions=size)
        if estimate(shape, layout, HBM_PER_CORE_GIB).fits:
            best = size
        else:
            break
    return best
