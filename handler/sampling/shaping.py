"""Output shaping for the batched sampler (`sampler.BatchSampler`): what a request asks of its
output beyond the token choice itself, applied in place to a step's `[rows, vocab]` scores (after
the repetition penalty), in this order:
- presence / frequency penalties (OpenAI's: minus frequency x count + presence x (count > 0) for
  each token the slot generated so far, its prompt not included), one accumulating scatter over
  per-slot tables of the distinct output tokens and their counts;
- logit_bias, one accumulating scatter;
- EOS suppression (`ignore_eos`), and EOS plus the request's stop token ids while the slot has
  generated fewer than `min_tokens`, one indexed fill;
- the grammar mask of the constrained rows (`handler/grammar/masks.py`), one call for all of
  them. The grammar wins over min_tokens: a row the mask leaves with no token (the grammar
  allows only EOS, which min_tokens suppressed) is redone from its logits with the mask alone.

Once the step's tokens are chosen, `after` advances the grammars and counts the output tokens.
A slot `shapes` while it needs any of this (min_tokens: until reached); `apply` and `after` see
only the rows whose slots do, and a step without any copies nothing for them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from handler.request import GenerationRequest, SlotRequest, SlotRequestError

if TYPE_CHECKING:
    from handler.grammar.masks import GrammarMasks

logger = logging.getLogger(__name__)

OUTPUT_TABLE_COLUMNS = 256  # distinct output tokens per slot the penalty tables hold at first (they grow)


@dataclass
class _ShapeState:
    presence: float = 0.0
    frequency: float = 0.0
    bias_ids: torch.Tensor | None = None  # logit_bias: token ids [n] and their biases [n]
    bias_values: torch.Tensor | None = None
    min_tokens: int = 0
    early_ids: torch.Tensor | None = None  # EOS and stop token ids: suppressed before min_tokens
    constrained: bool = False
    generated: int = 0  # tokens chosen for this slot so far (counted only while `shaped`)
    # Output token -> its column in the slot's rows of the presence/frequency tables.
    seen: dict[int, int] = field(default_factory=dict)
    shaped: bool = False  # this step needs one of the processors here

    @property
    def output_penalties(self) -> bool:
        return self.presence != 0.0 or self.frequency != 0.0

    def update_shaped(self) -> None:
        self.shaped = (
            self.output_penalties or self.bias_ids is not None or self.constrained or self.generated < self.min_tokens
        )


class OutputShaper:
    """The grammar masks, the presence / frequency tables and each slot's shaping state, for one
    `BatchSampler`; `add` when a slot is prefilled, `remove` when it is released.

    `tokenizer` and `vocab_size` (the width of the scores `apply` is given) are what grammar masks
    need; without a tokenizer every constraint is refused (`refusal`). The masks are built on
    first use; `warmup` builds them ahead (llguidance's view of a 128k tokenizer takes seconds),
    so that no request's step pays for it."""

    def __init__(
        self, n_slots: int, eos_token_ids: torch.Tensor, tokenizer: Any = None, vocab_size: int | None = None
    ) -> None:
        self.n_slots = n_slots
        self.eos_token_ids = eos_token_ids  # sorted, long
        self._slots: dict[int, _ShapeState] = {}
        self._tokenizer = tokenizer
        self.vocab_size = vocab_size if vocab_size is not None or tokenizer is None else len(tokenizer)
        self._masks: GrammarMasks | None = None
        self._grammar_problem = None if tokenizer is not None else "this backend has no tokenizer to build grammars on"
        # Presence / frequency tables, [slot, column]: each distinct output token and its count. numpy,
        # for cheap single-element updates; read through torch views sharing the memory.
        self._output_ids = np.zeros((n_slots, 0), dtype=np.int64)
        self._output_counts = np.zeros((n_slots, 0), dtype=np.float32)

    # -- grammars ------------------------------------------------------------------------
    def warmup(self) -> None:
        """Build the grammar masks now (a backend's warm-up calls this)."""
        self._grammar()

    def refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """("constraint", why) when a constraint cannot be enforced: there is no tokenizer, or the
        grammar engine could not take it (known after `warmup`). Never builds anything: the
        service asks from its own threads."""
        if request.constraint is not None and self._grammar_problem is not None:
            return "constraint", self._grammar_problem
        return None

    def _grammar(self) -> GrammarMasks | None:
        if self._masks is None and self._grammar_problem is None:
            from handler.grammar.masks import GrammarMasks  # llguidance: loaded by the backends that sample

            try:
                masks = GrammarMasks(self._tokenizer, self.vocab_size, self.eos_token_ids.tolist())
                masks.prepare()
            except Exception as exc:  # a tokenizer llguidance cannot read: constraints are refused, serving goes on
                self._grammar_problem = f"the grammar engine cannot use this model's tokenizer: {exc}"
                logger.warning("constrained output is off: %s", self._grammar_problem)
            else:
                self._masks = masks
        return self._masks

    # -- slots ---------------------------------------------------------------------------
    def add(self, request: SlotRequest) -> None:
        """Raises SlotRequestError when the request's constraint cannot be enforced; nothing of the
        request is kept then."""
        params, slot = request.sampling, request.slot
        if request.constraint is not None:
            masks = self._grammar()
            if masks is None:
                raise SlotRequestError(slot, f"the constraint cannot be enforced: {self._grammar_problem}")
            try:
                masks.add(slot, request.constraint)
            except ValueError as exc:
                raise SlotRequestError(slot, f"the constraint cannot be enforced: {exc}") from None
        elif self._masks is not None:
            self._masks.remove(slot)
        state = _ShapeState(
            presence=params.presence_penalty,
            frequency=params.frequency_penalty,
            min_tokens=params.min_tokens,
            constrained=request.constraint is not None,
        )
        if state.output_penalties:
            if self._output_ids.shape[1] == 0:
                self._grow_output_tables(OUTPUT_TABLE_COLUMNS)
            self._output_ids[slot] = 0
            self._output_counts[slot] = 0.0  # columns past the slot's own hold 0: a scatter of them adds 0
        vocab = self.vocab_size
        bias = {t: b for t, b in dict(params.logit_bias).items() if vocab is None or t < vocab}  # the last one wins
        if bias:
            state.bias_ids = torch.tensor(list(bias), dtype=torch.long)
            state.bias_values = torch.tensor(list(bias.values()), dtype=torch.float32)
        if params.min_tokens > 0:
            early = {*self.eos_token_ids.tolist(), *request.stop_token_ids}
            state.early_ids = torch.tensor(sorted(early), dtype=torch.long)
        state.update_shaped()
        self._slots[slot] = state

    def remove(self, slot: int) -> None:
        self._slots.pop(slot, None)
        if self._masks is not None:
            self._masks.remove(slot)

    def shapes(self, slot: int) -> bool:
        """Whether the slot's next step needs `apply` (its scores copied)."""
        return self._slots[slot].shaped

    # -- one step ------------------------------------------------------------------------
    def apply(
        self,
        scores: torch.Tensor,
        logits: torch.Tensor,
        slots: Sequence[int],
        rows: list[int],
        suppressed: list[int],
    ) -> list[int]:
        """In place, on `scores` [len(slots), vocab] (a copy of `logits`' first vocab columns, the
        repetition penalty applied): the shaped `rows`' presence / frequency penalties, logit_bias,
        suppression (the `suppressed` ignore_eos rows too, shaped or not), the grammar mask.
        Returns the constrained rows."""
        states = {i: self._slots[slots[i]] for i in rows}
        vocab = scores.shape[1]
        counted = [i for i in rows if states[i].output_penalties and states[i].seen]
        if counted:
            self._penalize_output(scores, slots, counted, states)
        biased = [i for i in rows if states[i].bias_ids is not None]
        if biased:
            ids = torch.cat([states[i].bias_ids for i in biased])
            values = torch.cat([states[i].bias_values for i in biased])
            at = torch.repeat_interleave(torch.tensor(biased), torch.tensor([len(states[i].bias_ids) for i in biased]))
            scores.index_put_((at, ids), values, accumulate=True)
        early = {i for i in rows if states[i].generated < states[i].min_tokens}
        banned = sorted(early.union(suppressed))
        if banned:
            lists = [states[i].early_ids if i in early else self.eos_token_ids for i in banned]
            ids = torch.cat(lists)
            at = torch.repeat_interleave(torch.tensor(banned), torch.tensor([len(ids) for ids in lists]))
            keep = ids < vocab
            scores.index_put_((at[keep], ids[keep]), torch.tensor(float("-inf")))
        constrained = [i for i in rows if states[i].constrained]
        if constrained:
            masks = self._masks
            assert masks is not None  # `add` built them for the constrained slot
            if vocab != masks.vocab_size:
                raise RuntimeError(f"the grammar masks are {masks.vocab_size} tokens wide, the logits {vocab}")
            masks.mask(scores, constrained, [slots[i] for i in constrained])
            # Only suppression (or a bias) can leave a row without a token: look there alone.
            ignoring = set(suppressed)
            at_risk = [i for i in constrained if i in early or i in ignoring or states[i].bias_ids is not None]
            if at_risk:
                self._revive(scores, logits, slots, at_risk, masks)
        return constrained

    def _revive(
        self, scores: torch.Tensor, logits: torch.Tensor, slots: Sequence[int], rows: list[int], masks: GrammarMasks
    ) -> None:
        """The grammar wins: rows the mask left without a token (its only tokens, EOS, were
        suppressed before min_tokens) are redone from their logits with the mask alone; rows
        whose logits are -inf on every allowed token then get those tokens equally likely."""
        vocab = scores.shape[1]
        for fill in ("logits", "uniform"):
            maxima = scores[torch.tensor(rows)].amax(dim=-1).tolist()
            rows = [i for i, m in zip(rows, maxima, strict=True) if m == float("-inf")]
            if not rows:
                return
            index = torch.tensor(rows)
            scores[index] = logits[index, :vocab].float() if fill == "logits" else 0.0
            masks.mask(scores, rows, [slots[i] for i in rows])

    def constraint_failures(self, slots: Sequence[int], constrained: list[int]) -> dict[int, str]:
        """The rows (of `constrained`) whose grammar the engine gave up on in this step, and why."""
        failures = self._masks.failures if self._masks is not None else {}
        return {i: failures[slots[i]] for i in constrained if slots[i] in failures} if failures else {}

    def after(self, slots: Sequence[int], rows: list[int], constrained: list[int], tokens: list[int]) -> None:
        """The shaped rows' bookkeeping once their tokens are chosen: the grammars advance, the
        output tokens are counted, a slot past min_tokens may leave the shaped rows."""
        if constrained:
            assert self._masks is not None
            self._masks.advance([slots[i] for i in constrained], [tokens[i] for i in constrained])
        for i in rows:
            slot = slots[i]
            state = self._slots[slot]
            state.generated += 1
            if state.output_penalties:
                self._count(slot, state, tokens[i])
            if state.generated == state.min_tokens:
                state.update_shaped()

    # -- presence / frequency tables -------------------------------------------------------
    def _penalize_output(
        self, scores: torch.Tensor, slots: Sequence[int], rows: list[int], states: dict[int, _ShapeState]
    ) -> None:
        """Presence and frequency penalties, in place: one accumulating scatter over the rows'
        [rows, distinct output tokens] tables (a column past a row's own adds 0)."""
        width = max(len(states[i].seen) for i in rows)
        index = np.array([slots[i] for i in rows])
        ids = torch.from_numpy(self._output_ids[index, :width])
        counts = torch.from_numpy(self._output_counts[index, :width])
        frequency = torch.tensor([[states[i].frequency] for i in rows], dtype=torch.float32)
        presence = torch.tensor([[states[i].presence] for i in rows], dtype=torch.float32)
        penalty = counts * frequency + (counts > 0) * presence
        row_index = torch.tensor(rows)[:, None].expand(-1, width)
        scores.index_put_((row_index, ids), penalty.neg_(), accumulate=True)

    def _count(self, slot: int, state: _ShapeState, token: int) -> None:
        column = state.seen.get(token)
        if column is None:
            column = state.seen[token] = len(state.seen)
            if column >= self._output_ids.shape[1]:
                self._grow_output_tables(2 * self._output_ids.shape[1])
            self._output_ids[slot, column] = token
        self._output_counts[slot, column] += 1.0

    def _grow_output_tables(self, width: int) -> None:
        old = self._output_ids.shape[1]
        ids = np.zeros((self.n_slots, width), dtype=np.int64)
        counts = np.zeros((self.n_slots, width), dtype=np.float32)
        ids[:, :old], counts[:, :old] = self._output_ids, self._output_counts
        self._output_ids, self._output_counts = ids, counts
