"""Timing profiles of compiled Neuron models, for the `sim` backend and the benchmarks.

A profile describes one compiled model the way transformers-neuronx builds it: a static
`batch_size`, `n_positions`, the context-length buckets a prompt is padded to, and
published step times:

- `decode_step_ms`: time of one decode step by the number of rows in it (per-token
  latency p50); linear in between, extended linearly beyond the points. A key is the tokens one
  forward computes: one per row in a plain decode step; a speculative verify step computes k + 1
  per row (`verify_s`), so a profile may carry points beyond `batch_size` for it: a verify of
  `batch_size` rows with (key / batch_size - 1) drafted tokens each (a generated profile carries the
  step-time model's at the widest verify, scripts/plan/sweep.py's `verify_ms`).
- `prefill_ms`: time of the context encoding (TTFT p50) by prompt tokens processed,
  rows x bucket length; linear in between and beyond.
- `vocab_size`: the model's vocabulary; the sim samples each step from logits this wide,
  so the host pays what it pays beside the device.
- `generated` (optional): the layout and workload a generated profile's times were modelled
  for (`make profiles`, scripts/plan/profiles.py), so that a test can regenerate the file and
  compare; absent from a profile of published figures.
- `lora_step_ms` (optional; absent is 0): what LoRA adapters add to a step, per distinct adapter
  among its rows (the base model's rows add nothing). No published figure calibrates it: neither
  the Neuron SDK's multi-LoRA guide nor vLLM's Neuron results give a per-adapter step cost on
  Inferentia2, so a profile that sets it says where its number came from (e.g. a measurement on
  the hf backend, or a guess for a what-if run), and none shipped sets it.

Profiles are YAML files in `profiles/`, each naming its source.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


class ProfileError(ValueError):
    """The profile file is missing or wrong; the message names the file and the key."""


class Generated(BaseModel):
    """What a generated profile was modelled for: enough to regenerate it (the step-time model
    lives outside handler/backends, so only the inputs are recorded here)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    by: str = Field(min_length=1)  # the generator, e.g. scripts/plan/profiles.py
    model: str = Field(min_length=1)  # a model of profiles/published-points.yaml
    tp_degree: int = Field(ge=1)
    weight_dtype: str = Field(min_length=1)
    prompt_tokens: int = Field(ge=1)
    prompt_spread: int = Field(ge=0)
    output_tokens: int = Field(ge=1)
    calibration_date: str = Field(min_length=1)  # published-points.yaml's date


class Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    batch_size: int = Field(ge=1)
    n_positions: int = Field(ge=8)
    vocab_size: int = Field(ge=2)
    context_buckets: tuple[int, ...] = Field(min_length=1)
    decode_step_ms: dict[int, float] = Field(min_length=1)
    prefill_ms: dict[int, float] = Field(min_length=1)
    generated: Generated | None = None
    lora_step_ms: float | None = Field(default=None, ge=0.0, allow_inf_nan=False)  # None: 0, uncalibrated

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if list(self.context_buckets) != sorted(set(self.context_buckets)) or self.context_buckets[0] < 1:
            raise ValueError("context_buckets must be positive and strictly increasing")
        if self.context_buckets[-1] > self.n_positions:
            raise ValueError(f"the largest context bucket {self.context_buckets[-1]} is above n_positions")
        for key, table in (("decode_step_ms", self.decode_step_ms), ("prefill_ms", self.prefill_ms)):
            if any(k < 1 or not (v > 0 and math.isfinite(v)) for k, v in table.items()):
                raise ValueError(f"{key}: keys must be >= 1 and times positive")
        return self

    # -- the model's timing ------------------------------------------------------
    def decode_s(self, rows: int) -> float:
        """Seconds for one decode step of `rows` rows."""
        return _interpolate(sorted(self.decode_step_ms.items()), rows) / 1000

    def verify_s(self, rows: int, draft_tokens: int) -> float:
        """Seconds for one speculative verify step of `rows` rows, each carrying `draft_tokens`
        drafted tokens: one forward of (draft_tokens + 1) x rows tokens, read off the decode table.

        Why the decode table and not `prefill_s`, though k + 1 tokens a row looks like a small
        prefill: a verify reads the weights once for all its tokens and attends to each row's cache,
        as a decode step does; the prefill table describes a context kernel that takes one row at a
        time, pads it to a context bucket (128 tokens and up) and pays a per-call overhead, which
        would charge a verify several prefills. No published Inferentia2 figure times a verify step.
        A generated profile carries the step-time model's verify of every slot at the widest k
        (scripts/plan/sweep.py's `verify_ms`: weights and each row's cache read once, the per-row
        overhead paid per token), and its table interpolates exactly for a narrower one. A profile
        of published figures has points up to `batch_size` only and extends linearly from its last
        two: each extra token costs what an extra row costs, its cache read included, an upper
        bound where the verify reads each row's cache once for its k + 1 queries."""
        return self.decode_s((draft_tokens + 1) * rows)

    def lora_s(self, adapters: int) -> float:
        """Seconds `adapters` distinct LoRA adapters add to one step (uncalibrated: module docstring)."""
        return adapters * (self.lora_step_ms or 0.0) / 1000

    def buckets_for(self, prompt_tokens: int) -> list[int]:
        """The context buckets one prompt is encoded in: the smallest that fits, or
        several passes of the largest for a prompt longer than every bucket."""
        i = bisect_left(self.context_buckets, prompt_tokens)
        if i < len(self.context_buckets):
            return [self.context_buckets[i]]
        largest = self.context_buckets[-1]
        return [largest] * math.ceil(prompt_tokens / largest)

    def prefill_s(self, rows: int, longest_prompt: int) -> float:
        """Seconds to encode a batch of `rows` prompts padded to the longest one's bucket."""
        points = sorted(self.prefill_ms.items())
        return sum(_interpolate(points, rows * bucket) for bucket in self.buckets_for(longest_prompt)) / 1000

    def ideal_tokens_per_s(self) -> float:
        """The roofline of this profile: a full batch every decode step."""
        return self.batch_size / self.decode_s(self.batch_size)


def expected_tokens_per_step(acceptance: float, draft_tokens: int) -> float:
    """Mean tokens a row takes from one verify step when each of its `draft_tokens` drafted tokens
    is accepted with probability `acceptance`, independently, up to the first rejection, plus the one
    token the step always gives: 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a); k + 1 at a = 1."""
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must be within [0, 1], got {acceptance}")
    if draft_tokens < 0:
        raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
    if acceptance == 1.0:
        return float(draft_tokens + 1)
    return (1 - acceptance ** (draft_tokens + 1)) / (1 - acceptance)


def _interpolate(points: Sequence[tuple[int, float]], x: float) -> float:
    """Piecewise-linear through the points, extended linearly; one point is a constant."""
    if len(points) == 1:
        return points[0][1]
    i = min(max(bisect_left([p[0] for p in points], x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def resolve_profile_path(profile: str, model_dir: str | Path | None) -> Path:
    """An absolute path, or one relative to the model archive, the repository, or the
    working directory (first that exists; a directory counts: handler.sim.hf_config may name a checkpoint)."""
    path = Path(profile)
    if path.is_absolute():
        return path
    bases = [Path(model_dir)] if model_dir else []
    for base in [*bases, REPO_ROOT, Path.cwd()]:
        if (base / path).exists():
            return base / path
    return (bases[0] if bases else REPO_ROOT) / path


def load_profile(path: str | Path) -> Profile:
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"sim profile {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"sim profile {path}: not valid YAML ({exc})") from None
    try:
        return Profile.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(top)'}: {e['msg']}" for e in exc.errors())
        raise ProfileError(f"sim profile {path}: {problems}") from None
