"""The step-level contract every backend (hf, sim, neuronx, nxdi) fulfils.

A backend holds `n_slots` slots, one sequence each. The engine drives it a step at a
time (TGI's Neuron `Generator` and vLLM's model runner work this way), each step by a plan
(handler/engine/plan.py): the requests to prefill, then the live slots to decode:

- `prefill(requests)`: encode each new request's prompt into its slot; return its first
  token (one per request);
- `decode_plan(rows)`: one decode step over the plan's rows (`DecodeRow`: a slot, how many
  tokens it may take this step, its adapter); return, per row, the LIST of tokens the row
  accepted this step, 1 to `row.max_tokens` of them. Each row's input is the last token it
  returned. The default runs `decode` and gives each row its one token; a backend that can
  give more (speculation: draft tokens the target model verified) overrides it and sets
  `tokens_per_step`, the most it gives a row, which the plan's `max_tokens` never exceeds.
  The tokens after one that ends the sequence (EOS, a stop) are dropped by `Sequence`;
  a backend may stop a row there itself;
- `decode(slots)`: one token more for each of the given live slots (what the default
  `decode_plan` calls);
- `release(slot)`: the slot's sequence ended (finished, failed, cancelled); forget it.

Backends pick tokens (every row of a call at once, with `handler/sampling/`) but never decide
when a sequence ends: EOS, stop strings and lengths are `Sequence`'s business. The
engine calls one method at a time (never concurrently), puts every live slot in every
decode call, keeps each request within `n_positions` (prompt + max_new_tokens), and
releases every slot of a call that raised. A `SlotRequestError` naming a slot fails that
sequence alone (the engine runs the call again without it); a row answered with no tokens or
more than its `max_tokens` fails alone too.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from handler.lora.adapters import AdapterError, AdapterSpec, read_adapter
from handler.request import DecodeRow, GenerationRequest, SlotRequest, SlotRequestError, TokenChoice

logger = logging.getLogger(__name__)


def clamp_n_positions(wanted: int, limit: int | None, what: str) -> int:
    """The configured n_positions, or less (with a warning) when the model allows fewer."""
    if limit is None or wanted <= limit:
        return wanted
    logger.warning("n_positions %d is above the %s's %d positions; using %d", wanted, what, limit, limit)
    return limit


class Backend(ABC):
    """A loaded model with `n_slots` sequence slots, driven a step at a time."""

    name: str
    tokenizer: Any
    n_positions: int
    eos_token_ids: frozenset[int]
    n_slots: int
    # The longest prompt one prefill takes (neuronx: the largest context bucket); None: n_positions bounds it.
    max_prompt_tokens: int | None = None
    # Token ids the model accepts are 0..vocab_size-1 (None: the tokenizer's length).
    vocab_size: int | None = None
    # The most tokens `decode_plan` gives one row in one step: the cap of every row's max_tokens.
    tokens_per_step: int = 1
    # Tokens the backend drafts itself for each decode row, each step (EAGLE on nxdi; the sim's
    # modelled proposals): the engine proposes none then (`DecodeRow.proposal` stays empty) and counts
    # min(draft_tokens, row.max_tokens - 1) proposed tokens per row; 0: the engine's proposer, if any.
    draft_tokens: int = 0

    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        """Why this backend cannot return the logprobs a request asks for, or None when it can.
        The service asks once, in `prepare`, and answers 400 naming the request's field."""
        return None

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """(the request field, why) when this backend cannot sample as a request asks (nxdi with
        on-device sampling has no seed, penalties or grammar); None when it can. Asked in `prepare`;
        the field is the domain's name (`sampling.seed` is "seed", `constraint`, ...)."""
        return None

    @property
    def sampling_s(self) -> float:
        """Host seconds the last prefill or decode call spent choosing tokens (0 for a backend
        that does not sample on the host); the engine records it per step."""
        return 0.0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    @abstractmethod
    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        """Prefill each request into its (free) slot; its first token, in request order."""

    # -- LoRA (handler/lora/): a backend that serves adapters overrides all three -------------
    def lora_shapes(self) -> dict[str, tuple[int, int]] | None:
        """The base model's linear layers an adapter may target: module name (q_proj, ...) to its
        (in_features, out_features); None: this backend serves no adapters."""
        return None

    def load_adapter(self, spec: AdapterSpec) -> None:
        """Make the (checked) adapter servable under `spec.name`: rows naming it run with it."""
        raise NotImplementedError(f"the {getattr(self, 'name', 'model')} backend serves no adapters")

    def unload_adapter(self, name: str) -> None:
        """Forget the adapter; no live row names it (the engine waits for its last one)."""
        raise NotImplementedError(f"the {getattr(self, 'name', 'model')} backend serves no adapters")

    def install_adapter(self, name: str, path: Path, max_rank: int) -> AdapterSpec:
        """The adapter at `path`, checked against this base model and loaded under `name`, at start
        and at run time alike; AdapterError naming it."""
        shapes = self.lora_shapes()
        if shapes is None:
            raise AdapterError(f"LoRA adapter {name!r}: the {getattr(self, 'name', 'model')} backend serves none")
        spec = read_adapter(name, path, max_rank, shapes)
        self.load_adapter(spec)
        return spec

    def runtime_adapter_refusal(self, unload: bool) -> str | None:
        """Why this backend cannot load (`unload`: unload) a LoRA adapter while it serves; None: it can."""
        if self.lora_shapes() is None:
            return f"the {getattr(self, 'name', 'model')} backend serves no LoRA adapters"
        return None

    def slot_adapter(self, slot: int) -> str | None:
        """The LoRA adapter the slot's prefill bound it to (None: the base model; a backend that
        serves no adapters never binds one)."""
        return None

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """One decode step over the plan's rows (every live slot): the tokens each row accepted,
        in `rows` order, 1 to `row.max_tokens` each. This default: `decode`'s one token per row.
        A row runs with the adapter its slot was prefilled with (`slot_adapter`); a row naming
        another fails alone (a 400 on `model`), never silently generated without it."""
        self.check_row_adapters(rows)
        return [[choice] for choice in self.decode([row.slot for row in rows])]

    def check_row_adapters(self, rows: Sequence[DecodeRow]) -> None:
        """Each row names the adapter its slot was prefilled with; SlotRequestError for one that does not."""
        for row in rows:
            bound = self.slot_adapter(row.slot)
            if row.adapter_id != bound:
                served = (
                    ""
                    if self.lora_shapes() is not None
                    else f" (the {getattr(self, 'name', 'model')} backend serves no adapters)"
                )
                raise SlotRequestError(
                    row.slot,
                    f"the decode row names LoRA adapter {row.adapter_id!r} but slot {row.slot} was prefilled with "
                    f"{bound!r}{served}",
                    "model",
                )

    @abstractmethod
    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        """One decode step over live slots; each one's next token, in `slots` order."""

    @abstractmethod
    def release(self, slot: int) -> None:
        """Forget the slot's sequence; the slot may be prefilled again."""

    def warmup(self) -> None:
        """Run whatever the first real request would otherwise pay for."""

    def close(self) -> None:
        """Release the model."""
