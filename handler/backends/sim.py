"""The `sim` backend: a compiled Inferentia model without weights, timed by a profile.

It behaves like a static-shape Neuron model described by a profile (sim_profile.py):
prompts are padded to a context bucket and encoded together (`prefill`), then every
decode step produces one token per row (`decode`); each call sleeps for what the
profile says that step takes on the device. Tokens come from the real tokenizer's
vocabulary, drawn from a generator seeded by the prompt (and the request's seed when
it samples), so a request's output is the same whoever its batch-mates are.

`SimModel` exposes the two steps, so a step-level scheduler can drive slots itself;
`SimBackend.generate` is the micro-batch loop built from them.

Time charged per step (`charge`):
- `live_rows` (default): a decode step costs the profile's time for the rows still
  generating, a prefill for the rows in the micro-batch;
- `compiled_batch`: every step costs the full compiled batch, which is what a
  static-shape model that pads its batch really pays.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from handler.backends.base import Backend, RowSpec, clamp_n_positions
from handler.backends.hf import load_tokenizer
from handler.backends.sim_profile import Profile, load_profile, resolve_profile_path
from handler.config import ConfigError, HandlerConfig, SimConfig
from handler.generation import left_pad

logger = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep_until(self, deadline: float) -> None: ...


class RealClock:
    """Sleeps until a deadline; `time.sleep` wakes late (about 0.2 ms on a VM), so it
    learns its oversleep and wakes that much earlier, keeping the mean step on time
    without busy-waiting (which would hold the GIL against the serving threads)."""

    def __init__(self) -> None:
        self._oversleep = 0.0

    def now(self) -> float:
        return time.perf_counter()

    def sleep_until(self, deadline: float) -> None:
        remaining = deadline - time.perf_counter() - self._oversleep
        if remaining <= 0:
            return
        time.sleep(remaining)
        late = time.perf_counter() - deadline
        self._oversleep = min(max(self._oversleep + 0.2 * late, 0.0), 0.002)


@dataclass
class SimSlot:
    """One request's row in the simulated model."""

    row: RowSpec
    rng: random.Random
    limit: int  # tokens this row may generate
    eos_at: int | None  # the token index (1-based) that is EOS; None: never
    generated: int = 0
    done: bool = False


def request_seed(row: RowSpec) -> int:
    """Stable across processes (unlike hash()): the prompt, plus the seed when sampling."""
    sampled_seed = row.sampling.seed if row.sampling.do_sample else None
    key = f"{','.join(map(str, row.prompt_ids))}|{sampled_seed}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def text_token_ids(tokenizer: Any) -> list[int]:
    """Ids that decode to text on their own: no special tokens, no partial UTF-8 bytes, so
    every simulated token streams as one chunk (held-back bytes would skew client ITL)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    text = [i for i in ids if (s := tokenizer.decode([i])) and "\ufffd" not in s]
    return text or ids


class SimModel:
    """The simulated device: `prefill` and `decode` steps over slots, timed by the profile."""

    def __init__(
        self,
        profile: Profile,
        vocab_ids: Sequence[int],
        eos_token_id: int,
        pad_token_id: int,
        n_positions: int,
        sim: SimConfig,
        clock: Clock | None = None,
    ) -> None:
        self.profile = profile
        self.vocab_ids = list(vocab_ids)
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.n_positions = n_positions
        self.sim = sim
        self.clock = clock or RealClock()
        self.busy_s = 0.0  # simulated device time charged so far
        self.steps = 0

    def new_slot(self, row: RowSpec) -> SimSlot:
        rng = random.Random(request_seed(row))
        limit = max(0, min(row.max_new_tokens, self.n_positions - len(row.prompt_ids)))
        eos_at = None if row.ignore_eos else rng.randint(1, 2 * self.sim.mean_natural_tokens - 1)
        return SimSlot(row, rng, limit, eos_at, done=limit == 0)

    def _rows(self, live: int) -> int:
        return self.profile.batch_size if self.sim.charge == "compiled_batch" else live

    def _charge(self, started: float, seconds: float) -> None:
        seconds *= self.sim.time_scale
        self.busy_s += seconds
        self.steps += 1
        self.clock.sleep_until(started + seconds)

    def _next_token(self, slot: SimSlot) -> int:
        slot.generated += 1
        if slot.generated == slot.eos_at:
            token = self.eos_token_id
            slot.done = True
        else:
            token = slot.rng.choice(self.vocab_ids)
        slot.done = slot.done or slot.generated >= slot.limit
        return token

    def prefill(self, slots: Sequence[SimSlot], wrap: Callable[[list[int]], Any] = list) -> Any:
        """Encode the slots' prompts together; returns each slot's first token, passed
        through `wrap` inside the timed step (e.g. into a tensor: work a real model's step
        does on the host, and slow right after a sleep, so it must not add to the step)."""
        started = self.clock.now()
        tokens = [self.pad_token_id if s.done else self._next_token(s) for s in slots]
        longest = max(len(s.row.prompt_ids) for s in slots)
        out = wrap(tokens)
        self._charge(started, self.profile.prefill_s(self._rows(len(slots)), longest))
        return out

    def decode(self, slots: Sequence[SimSlot], wrap: Callable[[list[int]], Any] = list) -> Any:
        """One step for every slot not yet done (done slots get the pad token)."""
        started = self.clock.now()
        live = sum(not s.done for s in slots)
        tokens = [self.pad_token_id if s.done else self._next_token(s) for s in slots]
        out = wrap(tokens)
        self._charge(started, self.profile.decode_s(self._rows(live)))
        return out


class SimBackend(Backend):
    name = "sim"

    def __init__(
        self, config: HandlerConfig, checkpoint: Path, model_dir: str | Path | None, clock: Clock | None = None
    ) -> None:
        if config.sim is None:
            raise ConfigError("model-config.yaml: handler.sim: required when backend is 'sim' (at least 'profile')")
        self.profile = load_profile(resolve_profile_path(config.sim.profile, model_dir))
        self.tokenizer = load_tokenizer(checkpoint, config.trust_remote_code)
        self.eos_token_ids = frozenset({self.tokenizer.eos_token_id})
        vocab_ids = text_token_ids(self.tokenizer)
        self.n_positions = clamp_n_positions(config.n_positions, self.profile.n_positions, "profile")
        self.model = SimModel(
            self.profile,
            vocab_ids,
            self.tokenizer.eos_token_id,
            self.tokenizer.pad_token_id,
            self.n_positions,
            config.sim,
            clock,
        )
        logger.info(
            "sim profile %s: batch_size=%d n_positions=%d step(1)=%.2f ms step(%d)=%.2f ms charge=%s time_scale=%g",
            self.profile.name,
            self.profile.batch_size,
            self.profile.n_positions,
            self.profile.decode_s(1) * 1000,
            self.profile.batch_size,
            self.profile.decode_s(self.profile.batch_size) * 1000,
            config.sim.charge,
            config.sim.time_scale,
        )

    def warmup(self) -> None:
        """Let the clock learn how late `time.sleep` wakes before the first request."""
        clock = self.model.clock
        for _ in range(20):
            clock.sleep_until(clock.now() + 0.005)

    @property
    def static_batch_size(self) -> int:
        return self.profile.batch_size

    def generate(self, rows: Sequence[RowSpec], streamer: Any, is_finished: Callable[[int], bool]) -> None:
        if len(rows) > self.profile.batch_size:
            raise ValueError(f"{len(rows)} rows exceed the compiled batch size {self.profile.batch_size}")
        streamer.put(left_pad([r.prompt_ids for r in rows], self.model.pad_token_id)[0])
        slots = [self.model.new_slot(row) for row in rows]
        streamer.put(self.model.prefill(slots, _as_tensor))
        while True:
            for i, slot in enumerate(slots):
                slot.done = slot.done or is_finished(i)
            if all(slot.done for slot in slots):
                return
            streamer.put(self.model.decode(slots, _as_tensor))


def _as_tensor(tokens: list[int]) -> torch.Tensor:
    return torch.tensor(tokens, dtype=torch.long)
