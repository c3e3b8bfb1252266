"""The `sim` backend: a compiled Inferentia model without weights, timed by a profile.

It behaves like a transformers-neuronx model compiled for continuous batching as the
profile (sim_profile.py) describes it: `n_slots` = the compiled batch size; a prefill
encodes one prompt at a time (the context kernel is compiled for batch 1 under
continuous batching, so prefilling k new rows costs k single-row prefills); a decode
step produces one token per live slot. Each call sleeps for what the profile says it
takes on the device. Tokens come from the real tokenizer's vocabulary, drawn from a
generator seeded by the prompt (and the request's seed when it samples), so a
request's output is the same whoever its batch-mates are. The "model" emits EOS after
a random number of tokens (unless the request ignores EOS); ending there is up to
`Sequence`, as with a real model.

The host's share is real: after each simulated device step the real sampler (`handler/sampling/`)
runs over `[rows, vocab_size]` stand-in logits (the profile's vocabulary; one buffer made at
start, every row alike, shaped like a language model's next-token distribution: a few dozen
likely tokens over a flat background). A sampled row's token is the sampler's pick folded
onto the tokenizer's text ids; a greedy row keeps the prompt-seeded draw (its argmax would be
the same token every step). So a sampled request costs what it costs beside a device.

The sampling fields, where the simulation can keep their promise:
- `constraint`: a constrained row's token IS the sampler's pick, grammar mask included (over the
  profile's vocabulary, padded past the tokenizer's ids, which it never allows), and the grammar,
  not the simulated EOS, ends it: the output matches, the mask costs what it costs at the
  profile's vocabulary. Needs a tokenizer no wider than the profile.
- `min_tokens`: the simulated EOS comes after it, and no stop token id is drawn before it.
- `stop_token_ids`: they end the output when drawn (`Sequence`).
- `presence_penalty`, `frequency_penalty`: applied by the sampler to the stand-in logits, as the
  repetition penalty is (the host pays for them); the drawn text is the simulation's.
- `logit_bias` is refused: a banned token must never appear and a forced one always, which
  tokens drawn from the vocabulary cannot promise.

Time charged per step (`charge`):
- `live_rows` (default): a decode step costs the profile's time for the slots in it;
- `compiled_batch`: every decode step costs the full compiled batch, which is what a
  static-shape model that pads its batch really pays.

Speculative decoding (`scheduler.speculation`, its k passed as `draft_tokens`): the sim models the
proposer and the verify rather than running one. `draft_tokens` = k and `tokens_per_step` = k + 1
(the engine then proposes nothing: the backend drafts itself, `Backend.draft_tokens`). Every decode
row drafts min(k, row.max_tokens - 1) tokens and accepts each in turn with probability
`handler.sim.speculation_acceptance`, stopping at the first rejection, plus the one token a step
always gives: 1 to k + 1 tokens, (1 - a^(k+1)) / (1 - a) on average. The draws come from a
generator of the row's own, seeded like its tokens (`request_seed`) but apart from them, so a run is
reproducible and a request's text is the same with or without speculation, as a real verify
guarantees: its tokens are the ones it would have drawn one step at a time (the host sampler runs
once per position, over the rows still taking tokens; a row stops at its EOS). Every row drafts,
sampled and constrained ones included (an EAGLE-style drafter's behaviour; the hf backend's prompt
lookup verifies greedy unshaped rows only). The verify step costs one forward of (k + 1) x rows
tokens (`Profile.verify_s`: the decode table at that width, not a prefill; its docstring says why),
whatever is accepted: at rate 0 a row gets one token a step for the wider forward.

LoRA adapters: `load_adapter` makes one servable by name (any checked PEFT adapter: `lora_shapes`
are the checkpoint's, from its config.json when it describes a Llama-family decoder); a row naming
one is served, its tokens drawn from a generator seeded by the adapter's name too (so an adapter's
output differs from the base model's, and each row's shows which adapter it ran with); a step costs
the profile's `lora_step_ms` more per distinct adapter among its rows (0 unless the profile says;
no published figure calibrates it).
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from handler.backends.base import Backend, clamp_n_positions
from handler.backends.host_sampling import HostSampling, Sampler
from handler.backends.memory_fit import amp_dtype, check_memory_fit, weight_dtype
from handler.backends.sim_profile import Profile, expected_tokens_per_step, load_profile, resolve_profile_path
from handler.backends.tokenizer import load_tokenizer
from handler.config import HandlerConfig, SimConfig
from handler.errors import ConfigError
from handler.lora.adapters import AdapterSpec
from handler.neuron.lora import llama_lora_shapes, read_config_json
from handler.neuron.memory import Layout
from handler.request import DecodeRow, GenerationRequest, SlotRequest, SlotRequestError, TokenChoice

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
    """One request's line in the simulated model."""

    request: SlotRequest
    rng: random.Random
    eos_at: int | None  # the token index (1-based) that is EOS; None: never
    position: int  # the next position to write
    generated: int = 0
    acceptance: random.Random | None = None  # speculation's draws (None: the model drafts nothing)


def request_seed(request: SlotRequest) -> int:
    """Stable across processes (unlike hash()): the prompt, plus the seed when sampling, plus the
    LoRA adapter's name when it names one."""
    sampled_seed = request.sampling.seed if request.sampling.do_sample else None
    adapter = f"|{request.adapter_id}" if request.adapter_id is not None else ""
    key = f"{','.join(map(str, request.prompt_ids))}|{sampled_seed}{adapter}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")


def acceptance_seed(request: SlotRequest) -> int:
    """The seed of a row's acceptance draws: the request's own (`request_seed`), kept apart from its
    tokens' generator so that drawing acceptances never changes the tokens."""
    return request_seed(request) ^ 0x5EC0_5EC0_5EC0_5EC0


def stand_in_logits(rows: int, vocab_size: int, likely: int = 40, seed: int = 0) -> torch.Tensor:
    """[rows, vocab_size] logits, every row the same: N(0, 1) over the vocabulary and `likely`
    tokens raised by about 12, so that at temperature 0.8 a top-p 0.9 nucleus is some twenty
    tokens, as a language model's usually is (random N(0, 1) logits would need thousands)."""
    generator = torch.Generator().manual_seed(seed)
    row = torch.randn(vocab_size, generator=generator)
    picked = torch.randperm(vocab_size, generator=generator)[: min(likely, vocab_size)]
    row[picked] = 12.0 + torch.randn(len(picked), generator=generator)
    return row.repeat(rows, 1)  # materialized: the sampler reads rows x vocab floats, as on a device


def text_token_ids(tokenizer: Any) -> list[int]:
    """Ids that decode to text on their own: no special tokens, no partial UTF-8 bytes, so
    every simulated token streams as one chunk (held-back bytes would skew client ITL)."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    text = [i for i in ids if (s := tokenizer.decode([i])) and "\ufffd" not in s]
    return text or ids


class SimModel:
    """The simulated device: `prefill` and `decode` over slots, timed by the profile."""

    def __init__(
        self,
        profile: Profile,
        vocab_ids: Sequence[int],
        eos_token_id: int,
        n_positions: int,
        sim: SimConfig,
        clock: Clock | None = None,
        tokenizer: Any = None,
        draft_tokens: int = 0,
    ) -> None:
        """`tokenizer`: the one grammar masks are built on; None: no constraint can be served.
        `draft_tokens`: scheduler.speculation's k (0: no speculation), modelled by `decode_plan`."""
        if draft_tokens < 0:
            raise ValueError(f"draft_tokens must be >= 0, got {draft_tokens}")
        self.draft_tokens = draft_tokens
        self.profile = profile
        self.vocab_ids = list(vocab_ids)
        self.eos_token_id = eos_token_id
        self.n_positions = n_positions
        self.sim = sim
        self.clock = clock or RealClock()
        self.slots: dict[int, SimSlot] = {}
        self.busy_s = 0.0  # simulated device time charged so far
        self.sampling_s = 0.0  # host seconds the last call's sampler calls took, together
        self.sampling = HostSampling(profile.batch_size, {eos_token_id}, n_positions, tokenizer, profile.vocab_size)
        self.logits = stand_in_logits(profile.batch_size, profile.vocab_size)

    @property
    def sampler(self) -> Sampler:
        """The sampler the host sampling drives. Settable: the bench's per-slot baseline
        (scripts/bench/per_slot_sampler.py, `PerSlotSimModel`) puts its own in its place."""
        return self.sampling.sampler

    @sampler.setter
    def sampler(self, sampler: Sampler) -> None:
        self.sampling.sampler = sampler

    def _charge(self, started: float, seconds: float) -> None:
        seconds *= self.sim.time_scale
        self.busy_s += seconds
        self.clock.sleep_until(started + seconds)

    def _next_tokens(self, slots: Sequence[int]) -> list[TokenChoice]:
        """The host's part of a step: the sampler over the step's rows, then each row's token."""
        for s in slots:
            slot = self.slots[s]
            if slot.position >= self.n_positions:
                raise ValueError(f"slot position {slot.position} is past n_positions {self.n_positions}")
        picks = self.sampling.next_tokens(slots, self.logits[: len(slots)])  # profile.vocab_size wide
        self.sampling_s += self.sampling.seconds
        out = []
        for s, pick in zip(slots, picks, strict=True):
            slot = self.slots[s]
            slot.position += 1
            slot.generated += 1
            request = slot.request
            if request.constraint is not None:
                token = pick.token_id  # the grammar's: among the tokenizer's ids, EOS once complete
            elif slot.generated == slot.eos_at:
                token = self.eos_token_id
            elif request.sampling.do_sample:
                token = self.vocab_ids[pick.token_id % len(self.vocab_ids)]
            else:
                token = slot.rng.choice(self.vocab_ids)
            if request.constraint is None and slot.generated <= request.sampling.min_tokens:
                token = self._not_stopping(slot, token)
            out.append(TokenChoice(token))  # no logits, so no logprobs
        return out

    def _not_stopping(self, slot: SimSlot, token: int) -> int:
        """Before min_tokens no stop token id may come (EOS cannot: eos_at is past min_tokens, and
        the vocabulary ids hold no special token): one drawn is drawn again, from the slot's rng."""
        stop = slot.request.stop_token_ids
        for _ in range(64):
            if token not in stop:
                return token
            token = slot.rng.choice(self.vocab_ids)
        return next((t for t in self.vocab_ids if t not in stop), token)

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        """One single-row prefill per request, one after another; then the host samples the
        first token of every row at once."""
        for request in requests:
            if request.slot in self.slots:
                raise ValueError(f"slot {request.slot} is occupied")
        self.sampling_s = 0.0
        try:
            for request in requests:
                started = self.clock.now()
                rng = random.Random(request_seed(request))
                eos_at = None if request.ignore_eos else rng.randint(1, 2 * self.sim.mean_natural_tokens - 1)
                if eos_at is not None and eos_at <= request.sampling.min_tokens:
                    eos_at = request.sampling.min_tokens + 1
                acceptance = random.Random(acceptance_seed(request)) if self.draft_tokens else None
                self.slots[request.slot] = SimSlot(
                    request, rng, eos_at, position=len(request.prompt_ids), acceptance=acceptance
                )
                # Not `first_tokens`: each request is registered before its simulated prefill is
                # charged, so a constraint the sampler cannot take fails the call before the clock
                # runs for it; the rows are then sampled together, as prefill rows (`_next_tokens`).
                self.sampling.register(request)
                lora_s = self.profile.lora_s(0 if request.adapter_id is None else 1)
                self._charge(started, self.profile.prefill_s(1, len(request.prompt_ids)) + lora_s)
            return self._next_tokens([r.slot for r in requests])
        except BaseException:
            for request in requests:
                self.release(request.slot)
            raise

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        started = self.clock.now()
        self._check_live(slots)
        self.sampling_s = 0.0
        self._charge(started, self.profile.decode_s(self._charged_rows(slots)) + self._lora_s(slots))
        return self._next_tokens(slots)

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """A speculative step (module docstring): one verify forward of (k + 1) x rows tokens, then
        each row's accepted run of tokens, drawn position by position as single steps would draw them."""
        started = self.clock.now()
        slots = [row.slot for row in rows]
        self._check_live(slots)
        self.sampling_s = 0.0
        verify_s = self.profile.verify_s(self._charged_rows(slots), self.draft_tokens)
        self._charge(started, verify_s + self._lora_s(slots))
        wanted = [1 + self._accepted(self.slots[row.slot], min(self.draft_tokens, row.max_tokens - 1)) for row in rows]
        out: list[list[TokenChoice]] = [[] for _ in rows]
        for position in range(max(wanted, default=0)):
            taking = [i for i, n in enumerate(wanted) if n > position and not self._ended(out[i])]
            if not taking:
                break
            for i, choice in zip(taking, self._next_tokens([slots[i] for i in taking]), strict=True):
                out[i].append(choice)
        return out

    def _accepted(self, slot: SimSlot, drafted: int) -> int:
        """How many of the row's `drafted` tokens the modelled verify accepts: each in turn with
        probability speculation_acceptance, up to the first rejection."""
        accepted = 0
        rng = slot.acceptance
        if rng is None:
            return 0
        while accepted < drafted and rng.random() < self.sim.speculation_acceptance:
            accepted += 1
        return accepted

    def _ended(self, tokens: list[TokenChoice]) -> bool:
        """The row's last token is the model's EOS: a real verify gives nothing after it."""
        return bool(tokens) and tokens[-1].token_id == self.eos_token_id

    def _check_live(self, slots: Sequence[int]) -> None:
        unknown = [s for s in slots if s not in self.slots]
        if unknown:
            raise ValueError(f"decode of slot(s) {unknown} that hold no sequence")

    def _charged_rows(self, slots: Sequence[int]) -> int:
        """The rows a step is charged for: the live ones, or the compiled batch (`charge`)."""
        return self.profile.batch_size if self.sim.charge == "compiled_batch" else len(slots)

    def _lora_s(self, slots: Sequence[int]) -> float:
        adapters = {self.slots[s].request.adapter_id for s in slots} - {None}
        return self.profile.lora_s(len(adapters))

    def release(self, slot: int) -> None:
        self.slots.pop(slot, None)
        self.sampling.release(slot)


class SimBackend(Backend):
    name = "sim"

    def __init__(
        self,
        config: HandlerConfig,
        checkpoint: Path,
        model_dir: str | Path | None,
        clock: Clock | None = None,
        speculative_tokens: int = 0,
    ) -> None:
        """`speculative_tokens`: scheduler.speculation's k (0: none); the sim drafts them itself."""
        if config.sim is None:
            raise ConfigError("model-config.yaml: handler.sim: required when backend is 'sim' (at least 'profile')")
        self.profile = load_profile(resolve_profile_path(config.sim.profile, model_dir))
        self.n_slots = self.profile.batch_size
        self.n_positions = clamp_n_positions(config.n_positions, self.profile.n_positions, "profile")
        if config.sim.hf_config is not None:  # the device backends' check, before anything loads
            layout = Layout(
                config.tp_degree, self.n_slots, self.n_positions, weight_dtype(config.amp), amp_dtype(config.amp)
            )
            check_memory_fit("sim", resolve_profile_path(config.sim.hf_config, model_dir), layout, required=True)
        self.tokenizer = load_tokenizer(checkpoint, config.trust_remote_code)
        hf_config = read_config_json(checkpoint)
        self._lora_shapes = llama_lora_shapes(hf_config) if hf_config is not None else None
        self.adapters: dict[str, AdapterSpec] = {}  # the LoRA adapters served, by name
        self.eos_token_ids = frozenset({self.tokenizer.eos_token_id})
        vocab_ids = text_token_ids(self.tokenizer)
        self._constraint_refusal: str | None = None
        if len(self.tokenizer) > self.profile.vocab_size:
            self._constraint_refusal = (
                f"the sim profile's vocabulary ({self.profile.vocab_size} tokens) is narrower than the tokenizer's "
                f"({len(self.tokenizer)}), so a grammar over the tokenizer cannot mask its logits"
            )
        self.model = SimModel(
            self.profile,
            vocab_ids,
            self.tokenizer.eos_token_id,
            self.n_positions,
            config.sim,
            clock,
            tokenizer=None if self._constraint_refusal else self.tokenizer,
            draft_tokens=speculative_tokens,
        )
        self.draft_tokens = speculative_tokens
        self.tokens_per_step = speculative_tokens + 1
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
        if speculative_tokens:
            logger.info(
                "sim speculation: k=%d drafted tokens per row, each accepted with probability %g "
                "(%.2f tokens per row and step on average); verify step(%d)=%.2f ms",
                speculative_tokens,
                config.sim.speculation_acceptance,
                expected_tokens_per_step(config.sim.speculation_acceptance, speculative_tokens),
                self.profile.batch_size,
                self.profile.verify_s(self.profile.batch_size, speculative_tokens) * 1000,
            )

    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        """The simulated model has no logits: its tokens are drawn from the vocabulary, so any
        logprob would be made up. Refused rather than invented."""
        if logprobs or prompt_logprobs:
            return "the sim backend has no logits (it simulates timing, not a model), so it returns no logprobs"
        return None

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """logit_bias always (see the module docstring); a constraint without a tokenizer that fits the
        profile."""
        if request.sampling.logit_bias:
            return "logit_bias", (
                "the sim backend draws its tokens from the vocabulary (it simulates timing, not a model), so it "
                "cannot keep a bias's promise (a banned token never appears, a forced one always does)"
            )
        if request.constraint is None:
            return None
        if self._constraint_refusal is not None:
            return "constraint", self._constraint_refusal
        return self.model.sampling.refusal(request)

    def warmup(self) -> None:
        """Build the sampler's grammar masks, and let the clock learn how late `time.sleep` wakes
        before the first request."""
        self.model.sampling.warmup()
        clock = self.model.clock
        for _ in range(20):
            clock.sleep_until(clock.now() + 0.005)

    @property
    def sampling_s(self) -> float:
        return self.model.sampling_s

    # -- LoRA ----------------------------------------------------------------------------
    def lora_shapes(self) -> dict[str, tuple[int, int]] | None:
        """The checkpoint's (config.json) Llama-family projections; None when it describes none."""
        return self._lora_shapes

    def load_adapter(self, spec: AdapterSpec) -> None:
        if self._lora_shapes is None:
            raise NotImplementedError(
                "the sim backend serves LoRA adapters on a checkpoint whose config.json describes a Llama-family "
                "decoder (hidden_size, num_attention_heads, intermediate_size), which this one does not"
            )
        self.adapters[spec.name] = spec

    def unload_adapter(self, name: str) -> None:
        if name not in self.adapters:
            raise ValueError(f"the sim backend serves no LoRA adapter {name!r}")
        live = sorted(slot for slot, state in self.model.slots.items() if state.request.adapter_id == name)
        if live:
            raise ValueError(f"LoRA adapter {name!r} is still in use by slot(s) {live}")
        del self.adapters[name]

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        for request in requests:
            if request.adapter_id is not None and request.adapter_id not in self.adapters:
                raise SlotRequestError(
                    request.slot, f"the sim backend serves no LoRA adapter {request.adapter_id!r}", "model"
                )
        return self.model.prefill(requests)

    def slot_adapter(self, slot: int) -> str | None:
        held = self.model.slots.get(slot)
        return None if held is None else held.request.adapter_id

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        return self.model.decode(slots)

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """Without speculation the base contract's one token a row; with it, the modelled verify
        step (`SimModel.decode_plan`)."""
        if not self.draft_tokens:
            return super().decode_plan(rows)
        self.check_row_adapters(rows)
        return self.model.decode_plan(rows)

    def release(self, slot: int) -> None:
        self.model.release(slot)
