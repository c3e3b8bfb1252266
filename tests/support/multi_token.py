"""A backend that gives every decode row several tokens a step, made of a real one: what a
speculating backend looks like to the engine (`Backend.decode_plan` answering up to
`tokens_per_step` tokens a row), with the real model's tokens, logprobs and grammars.

`MultiTokenBackend(inner, k)` answers a decode row with min(k, row.max_tokens) tokens by running
the inner backend's `decode` up to k times, each time over the rows that still want a token. A
row stops early after a token that ends it for sure (EOS unless the request ignores it, one of
its stop token ids, a constraint failure), as a real backend would: a grammar has nothing to
follow EOS with. A stop string is `Sequence`'s business: the tokens after it are dropped there,
and the row, ended, is released.

The inner backend must decode any subset of its live slots, each row's tokens independent of
its batch-mates: hf and sim do; neuronx and nxdi must decode every live slot in every call.
"""

from __future__ import annotations

from collections.abc import Sequence

from handler.backends.base import Backend
from handler.request import DecodeRow, GenerationRequest, SlotRequest, SlotRequestError, TokenChoice


class MultiTokenBackend(Backend):
    def __init__(self, inner: Backend, k: int) -> None:
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.inner = inner
        self.k = k
        self.name = f"{inner.name}-x{k}"
        self.tokenizer = inner.tokenizer
        self.n_positions = inner.n_positions
        self.eos_token_ids = inner.eos_token_ids
        self.n_slots = inner.n_slots
        self.max_prompt_tokens = inner.max_prompt_tokens
        self.vocab_size = inner.vocab_size
        self.tokens_per_step = k
        self._ends: dict[int, frozenset[int]] = {}  # live slot -> the token ids that end it
        self._given: dict[int, int] = {}  # live slot -> tokens handed out, its prefill's included
        self._sampling_s = 0.0
        self.steps: list[list[int]] = []  # per decode step: the tokens each row got
        self.given: list[tuple[tuple[int, ...], int]] = []  # per released sequence: (prompt ids, tokens handed out)
        self._prompts: dict[int, tuple[int, ...]] = {}

    @property
    def sampling_s(self) -> float:
        return self._sampling_s

    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        return self.inner.logprobs_refusal(logprobs, prompt_logprobs)

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        return self.inner.request_refusal(request)

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        choices = self.inner.prefill(requests)
        self._sampling_s = self.inner.sampling_s
        for request in requests:
            eos = frozenset() if request.ignore_eos else frozenset(self.eos_token_ids)
            self._ends[request.slot] = eos | frozenset(request.stop_token_ids)
            self._given[request.slot] = 1
            self._prompts[request.slot] = request.prompt_ids
        return choices

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        return self.inner.decode(slots)

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        for row in rows:
            if row.adapter_id is not None:
                raise SlotRequestError(row.slot, f"the {self.name} backend serves no adapters", "model")
        wanted = {row.slot: min(self.k, row.max_tokens) for row in rows}
        got: dict[int, list[TokenChoice]] = {row.slot: [] for row in rows}
        self._sampling_s = 0.0
        while True:
            slots = [r.slot for r in rows if len(got[r.slot]) < wanted[r.slot] and not self._ended(r.slot, got)]
            if not slots:
                break
            for slot, choice in zip(slots, self.inner.decode(slots), strict=True):
                got[slot].append(choice)
            self._sampling_s += self.inner.sampling_s
        self.steps.append([len(got[row.slot]) for row in rows])
        for row in rows:
            self._given[row.slot] += len(got[row.slot])
        return [got[row.slot] for row in rows]

    def _ended(self, slot: int, got: dict[int, list[TokenChoice]]) -> bool:
        if not got[slot]:
            return False
        last = got[slot][-1]
        return last.constraint_failure is not None or last.token_id in self._ends[slot]

    def release(self, slot: int) -> None:
        self._ends.pop(slot, None)
        if slot in self._given:
            self.given.append((self._prompts.pop(slot), self._given.pop(slot)))
        self.inner.release(slot)

    def warmup(self) -> None:
        self.inner.warmup()

    def close(self) -> None:
        self.inner.close()
