"""Token choice for every row of a step in one vectorized pass (the backends with logits:
hf, neuronx, and sim on its stand-in logits).

Per step, over the `[rows, vocab]` logits of the rows in that step (on a copy, and only when
some row asks for one of these):
- repetition penalty (transformers' rule: a seen token's score is divided by the penalty when
  positive, multiplied when negative), gathered and scattered over a per-slot history tensor
  kept here, for the rows that ask for it;
- the output shaping (`shaping.OutputShaper`, whose docstring has the details): presence /
  frequency penalties, logit_bias, EOS suppression (`ignore_eos`) and EOS plus the request's
  stop token ids before `min_tokens`, the grammar mask of the constrained rows (the grammar
  wins over min_tokens). When no row needs the rest, `ignore_eos` is one indexed fill here;
- greedy rows: one argmax;
- sampled rows: temperature, then top-k and top-p on the softmax, then one uniform draw per
  row picked by inverse CDF over the kept tokens in descending probability order (ties by
  token id). The kept set is found among a few candidates (`torch.topk`); a row whose kept
  set, or whose pick, reaches past the candidates goes to a larger candidate set and, last,
  to the full sort. Every path gives the token the exact full-vocabulary computation gives
  for the same draw (`choice.choose_sorted` is that computation on any sorted prefix).

Seeds: each slot draws from its own `random.Random` (the request's seed, or a random one),
one float per sampled step, so a request's tokens do not depend on its batch-mates or on the
batch size. Logprobs are those of the distribution the token was drawn from (after the
penalties, bias, suppression and grammar mask above, temperature, top-k and top-p; a greedy row
without any of them gets the model's own log-softmax), so a constrained row's are over the
tokens its grammar allowed.

A step in which no row asks for any of the processing above reads the caller's logits as they
are: no copy.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from handler.request import GenerationRequest, SlotRequest, TokenChoice
from handler.sampling.choice import CANDIDATE_TIERS, Chosen, argmax_rows, choose_sorted, sorted_candidates
from handler.sampling.logprobs import top_alternatives
from handler.sampling.shaping import OutputShaper


@dataclass
class _SlotState:
    do_sample: bool
    temperature: float
    top_k: int
    top_p: float
    penalty: float
    ignore_eos: bool
    logprobs: int | None
    draws: random.Random  # one uniform float per sampled step, from the request's seed
    history_len: int = 0  # tokens in the slot's history row (penalty only)


class BatchSampler:
    """Picks the next token of every row of a step; one instance per backend, `add` when a
    slot is prefilled, `remove` when it is released. Not thread-safe (the engine calls a
    backend from one thread at a time).

    `tokenizer` and `vocab_size` (the width of the logits `sample` is given, padding cut off)
    are what grammar masks need; without a tokenizer every constraint is refused (`refusal`).
    The output shaping (penalties on the output, logit_bias, suppression, grammar masks) is
    `shaping.OutputShaper`'s; `warmup` builds its masks ahead (llguidance's view of a 128k
    tokenizer takes seconds), so that no request's step pays for it."""

    def __init__(
        self,
        n_slots: int,
        eos_token_ids: frozenset[int] | set[int],
        n_positions: int,
        tokenizer: Any = None,
        vocab_size: int | None = None,
    ) -> None:
        self.n_slots = n_slots
        self.eos_token_ids = torch.tensor(sorted(eos_token_ids), dtype=torch.long)
        self._slots: dict[int, _SlotState] = {}
        self._history = torch.zeros((n_slots, max(n_positions, 1) + 1), dtype=torch.long)
        self._workspace = _Workspace()
        self._shaper = OutputShaper(n_slots, self.eos_token_ids, tokenizer, vocab_size)
        self.last_s = 0.0  # host seconds the last `sample` call took

    # -- grammars ------------------------------------------------------------------------
    def warmup(self) -> None:
        """Build the grammar masks now (a backend's warm-up calls this)."""
        self._shaper.warmup()

    def refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """("constraint", why) when this sampler cannot enforce a constraint: it has no tokenizer,
        or the grammar engine could not take it (known after `warmup`). Never builds anything: the
        service asks from its own threads."""
        return self._shaper.refusal(request)

    # -- slots ---------------------------------------------------------------------------
    def add(self, request: SlotRequest) -> None:
        """Raises SlotRequestError when the request's constraint cannot be enforced; nothing of the
        request is kept then."""
        self._shaper.add(request)  # first: it raises before anything of the request is kept
        params, slot = request.sampling, request.slot
        state = _SlotState(
            do_sample=params.do_sample,
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            penalty=params.repetition_penalty,
            ignore_eos=request.ignore_eos and len(self.eos_token_ids) > 0,
            logprobs=request.logprobs,
            draws=random.Random(params.seed),  # None: seeded from the OS
        )
        if state.penalty != 1.0:
            prompt = torch.tensor(request.prompt_ids, dtype=torch.long)
            self._reserve(len(prompt) + 1)
            # Past its length the row repeats a token it holds, so a gather/scatter over a
            # wider span than the row is harmless (the same value written twice).
            self._history[slot].fill_(int(prompt[0]) if len(prompt) else 0)
            self._history[slot, : len(prompt)] = prompt
            state.history_len = len(prompt)
        self._slots[slot] = state

    def remove(self, slot: int) -> None:
        self._slots.pop(slot, None)
        self._shaper.remove(slot)

    # -- one step ------------------------------------------------------------------------
    def sample(self, slots: Sequence[int], logits: torch.Tensor, vocab_size: int | None = None) -> list[TokenChoice]:
        """The token of each row: `logits` [len(slots), >= vocab] (columns past `vocab_size`
        are padding and ignored). The input is never modified."""
        started = time.perf_counter()
        states = [self._slots[slot] for slot in slots]
        vocab = vocab_size or logits.shape[-1]
        scores = logits[:, :vocab]
        penalized = [i for i, s in enumerate(states) if s.penalty != 1.0]
        suppressed = [i for i, s in enumerate(states) if s.ignore_eos]
        shaped = [i for i, slot in enumerate(slots) if self._shaper.shapes(slot)]
        constrained: list[int] = []
        if penalized or suppressed or shaped or scores.dtype != torch.float32:
            scores = self._workspace.get("scores", len(states), vocab).copy_(scores)
            if penalized:
                self._penalize(scores, [slots[i] for i in penalized], penalized, states)
            if shaped:
                constrained = self._shaper.apply(scores, logits, slots, shaped, suppressed)
            elif suppressed:
                ids = self.eos_token_ids[self.eos_token_ids < vocab]
                scores[torch.tensor(suppressed)[:, None], ids[None, :]] = float("-inf")
        tokens = [0] * len(states)
        logprobs: list[tuple[float, tuple[tuple[int, float], ...]] | None] = [None] * len(states)
        greedy = [i for i, s in enumerate(states) if not s.do_sample]
        sampled = [i for i, s in enumerate(states) if s.do_sample]
        if greedy:
            self._greedy(scores, greedy, states, tokens, logprobs)
        if sampled:
            self._sampled(scores, sampled, states, tokens, logprobs)
        for slot, state, token in zip(slots, states, tokens, strict=True):
            if state.penalty != 1.0:
                self._remember(slot, state, token)
        failed = self._shaper.constraint_failures(slots, constrained) if constrained else {}
        if shaped:
            self._shaper.after(slots, shaped, constrained, tokens)
        self.last_s = time.perf_counter() - started
        choices = [
            TokenChoice(token) if lp is None else TokenChoice(token, lp[0], lp[1])
            for token, lp in zip(tokens, logprobs, strict=True)
        ]
        for i, reason in failed.items():
            choices[i] = dataclasses.replace(choices[i], constraint_failure=reason)
        return choices

    def _rows(self, scores: torch.Tensor, rows: list[int], name: str) -> torch.Tensor:
        """The given rows of `scores`: the tensor itself when it is all of them, else a copy in
        a reused buffer (a fresh [rows, vocab] tensor each step costs more than the math)."""
        if len(rows) == scores.shape[0]:
            return scores
        out = self._workspace.get(name, len(rows), scores.shape[1])
        return torch.index_select(scores, 0, torch.tensor(rows), out=out)

    def _greedy(self, scores, rows, states, tokens, logprobs) -> None:
        block = self._rows(scores, rows, "greedy")
        picked = argmax_rows(block).tolist()
        for i, token in zip(rows, picked, strict=True):
            tokens[i] = token
        asking = [j for j, i in enumerate(rows) if states[i].logprobs is not None]
        if asking:
            lp = torch.log_softmax(block[torch.tensor(asking)], dim=-1)
            for r, j in enumerate(asking):
                i = rows[j]
                logprobs[i] = (float(lp[r, tokens[i]]), top_alternatives(lp[r], states[i].logprobs or 0))

    def _sampled(self, scores, rows, states, tokens, logprobs) -> None:
        vocab = scores.shape[-1]
        chosen = [states[i] for i in rows]
        temperature = torch.tensor([[s.temperature] for s in chosen], dtype=torch.float32)
        scaled = self._workspace.get("scaled", len(rows), vocab)
        torch.div(self._rows(scores, rows, "scaled"), temperature, out=scaled)
        probs = _softmax_into(scaled, self._workspace.get("probs", len(rows), vocab))
        top_k = np.array([s.top_k for s in chosen])
        top_p = np.array([s.top_p for s in chosen], dtype=np.float64)
        draws = np.array([s.draws.random() for s in chosen])
        pending = np.arange(len(rows))
        for count in (*CANDIDATE_TIERS, vocab):
            sub = probs if len(pending) == len(rows) else probs[torch.from_numpy(pending)]
            values, ids, safe = sorted_candidates(sub, min(count, vocab))
            result = choose_sorted(values, safe, top_k[pending], top_p[pending], draws[pending], vocab)
            for r in np.flatnonzero(result.resolved):
                i = rows[pending[r]]
                tokens[i] = int(ids[r, result.position[r]])
                if states[i].logprobs is not None:
                    logprobs[i] = _kept_logprobs(values[r], ids[r], result, r, states[i].logprobs)
            pending = pending[~result.resolved]
            if len(pending) == 0:
                return
        raise AssertionError("the full sort resolves every row")  # choose_sorted's contract

    def _penalize(self, scores, slots, rows, states) -> None:
        """In place, on the penalized rows' seen tokens only: [rows, history] gathers, no
        [rows, vocab] temporaries."""
        width = max(states[i].history_len for i in rows)
        history = self._history[torch.tensor(slots), :width]
        row_index = torch.tensor(rows)[:, None].expand(-1, width)
        penalty = torch.tensor([states[i].penalty for i in rows], dtype=torch.float32)[:, None]
        seen = scores[row_index, history]
        scores[row_index, history] = torch.where(seen < 0, seen * penalty, seen / penalty)

    def _remember(self, slot: int, state: _SlotState, token: int) -> None:
        self._reserve(state.history_len + 1)
        self._history[slot, state.history_len] = token
        state.history_len += 1

    def _reserve(self, length: int) -> None:
        """Room for `length` tokens per history row (a request past n_positions is refused
        elsewhere; this only keeps the sampler from failing first)."""
        width = self._history.shape[1]
        if length > width:
            grown = torch.zeros((self.n_slots, max(length, 2 * width)), dtype=torch.long)
            grown[:, :width] = self._history
            grown[:, width:] = self._history[:, :1]
            self._history = grown


class _Workspace:
    """Named float32 buffers reused from step to step, grown when a step needs more."""

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, rows: int, columns: int) -> torch.Tensor:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.numel() < rows * columns:
            buffer = self._buffers[name] = torch.empty(rows * columns, dtype=torch.float32)
        return buffer[: rows * columns].view(rows, columns)


def _kept_logprobs(
    values: np.ndarray, ids: np.ndarray, result: Chosen, r: int, n: int
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """A sampled row's logprob and alternatives: the kept tokens, renormalized."""
    kept = int(result.kept[r])
    with np.errstate(divide="ignore"):  # kept tokens of probability 0 (past a grammar's allowed set): -inf
        lp = np.log(values[:kept].astype(np.float64) / result.mass[r])
    top = min(n, kept)
    alternatives = tuple((int(t), float(v)) for t, v in zip(ids[:top], lp[:top], strict=True) if v > -np.inf)
    return float(lp[result.position[r]]), alternatives


def _softmax_into(scores: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """softmax(scores) written into `out` (the public softmax has no `out=`; the aten op has)."""
    try:
        return torch.ops.aten._softmax.out(scores, -1, False, out=out)
    except (AttributeError, RuntimeError):  # an aten without the out variant: allocate
        return torch.softmax(scores, dim=-1)
