"""The `hf` backend: transformers on CPU, the reference and the embedded default.

It fulfils the step-level contract (`base.Backend`) with a real KV cache per slot, so
sequences join and leave between decode steps:

- `prefill` runs each new prompt alone (batch 1, no padding, positions 0..n-1) into a
  fresh `DynamicCache` and samples the slot's first token from the last position;
- `decode` runs ONE forward for the given slots: their caches are left-padded to a
  common length and stacked (zeros on the padding, masked out by a 2-D attention mask),
  each row's new token sits at its own position (its cached length), and the rows are
  sampled together by the backend's host sampling (`host_sampling.HostSampling`).

The stacked cache is kept between steps: while the decoded set of slots stays the same,
each step appends one column to it (as `generate` does). It is rebuilt only when a slot
joins (prefilled since the last step) or leaves (released); then every row is copied once
into the new stack. A row's K/V never depends on its batch-mates (padding is masked), so a
request's tokens are those it gets alone.

LoRA adapters (`hf_lora.HFAdapters`, PEFT): a slot runs with the adapter its prefill named, every
step; one decode forward mixes rows of different adapters and base rows, each row getting only its
own adapter's change, so a row's tokens are still those it gets alone.

Speculation (`scheduler.speculation`, `decode_plan` with rows carrying proposals): a row's next
token and its proposed ones go through the same forward, and it takes the proposals the sampler
picks at their positions, then the pick after them (handler/sampling/speculative.py: exact for every
kind of row); positions of rejected proposals stay in the stacked cache with a 0 in the mask
(holes), dropped at the next restack: when a slot joins or leaves, or when holes fill more than
half the stacked width (`_Batch.mostly_holes`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache

from handler.backends.base import Backend, clamp_n_positions
from handler.backends.hf_lora import HFAdapters
from handler.backends.host_sampling import HostSampling
from handler.backends.kv_cache import AppendCache, ForwardKwargs, LayerKV, layers_of, stack, truncate, unpad_row
from handler.backends.tokenizer import eos_token_ids, load_tokenizer
from handler.config import HandlerConfig
from handler.request import DecodeRow, GenerationRequest, SlotRequest, SlotRequestError, TokenChoice
from handler.sampling.logprobs import prompt_logprobs
from handler.sampling.speculative import Pick, take_verified

if TYPE_CHECKING:
    from handler.lora.adapters import AdapterSpec

logger = logging.getLogger(__name__)

TORCH_DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
HOLE_SLACK = 64  # masked columns a stacked batch may carry beyond its longest row's length before a restack
# transformers 4.56 renamed `torch_dtype=` to `dtype=`; Neuron environments pin 4.4x.
_MAJOR_MINOR = tuple(int(part) for part in transformers.__version__.split(".")[:2])
DTYPE_KWARG = "dtype" if _MAJOR_MINOR >= (4, 56) else "torch_dtype"


def load_model(auto_class: Any, folder: Path, config: HandlerConfig) -> Any:
    """A checkpoint's model for inference on CPU: safetensors only, offline, in `config.amp`."""
    return auto_class.from_pretrained(
        folder,
        local_files_only=True,
        use_safetensors=True,
        trust_remote_code=config.trust_remote_code,
        **{DTYPE_KWARG: TORCH_DTYPES[config.amp]},
    ).eval()


@dataclass
class _Slot:
    """One live sequence."""

    length: int  # positions held in its cache (prompt + tokens already run through the model)
    next_token: int  # sampled, not yet run through the model: the next decode's input
    kv: list[LayerKV] | None  # its own K/V (batch of one) while it is not a row of the stacked batch
    adapter: str | None = None  # the LoRA adapter it runs with (None: the base model)


@dataclass
class _Batch:
    """The stacked cache of the slots decoded last step, row i = slots[i]."""

    slots: tuple[int, ...]
    cache: Any
    mask: torch.Tensor  # [rows, width]: 1 on each row's real positions, 0 on its left padding
    stale: set[int] = field(default_factory=set)  # rows whose slot was released since

    def reusable_for(self, slots: Sequence[int]) -> bool:
        return not self.stale and len(slots) == len(self.slots) and set(slots) == set(self.slots)

    def mostly_holes(self, longest: int) -> bool:
        """Whether more than half the stacked width is neither a row's positions nor its left padding
        (speculation's rejected positions, or a row padded to a batch-mate's proposals): the next step
        restacks then, so that attention and the buffers do not keep growing with them."""
        return self.mask.shape[1] > 2 * longest + HOLE_SLACK

    def row_kv(self, slot: int, length: int) -> list[LayerKV]:
        row = self.slots.index(slot)
        if int(self.mask[row, -length:].sum()) == length:  # contiguous: left padding only (a view)
            return unpad_row(layers_of(self.cache), row, self.mask.shape[1] - length)
        # Speculation left holes (rejected proposals' positions, masked out): its positions only (a copy).
        kept = self.mask[row].nonzero().squeeze(1)
        return [
            (keys[row : row + 1, :, kept], values[row : row + 1, :, kept]) for keys, values in layers_of(self.cache)
        ]


class HFBackend(Backend):
    name = "hf"

    def __init__(self, config: HandlerConfig, checkpoint: Path, n_slots: int, speculative_tokens: int = 0) -> None:
        """`speculative_tokens`: the most proposed tokens a decode row may carry (scheduler.speculation's k)."""
        if n_slots < 1:
            raise ValueError(f"n_slots must be at least 1, got {n_slots}")
        self.tokens_per_step = 1 + speculative_tokens
        if config.cpu_threads is not None:
            # On a small host the model's threads compete with the TorchServe frontend and the
            # clients; leaving them a core can serve more tokens/s, not fewer.
            torch.set_num_threads(config.cpu_threads)
            logger.info("hf: torch intra-op threads set to %d", config.cpu_threads)
        self.tokenizer = load_tokenizer(checkpoint, config.trust_remote_code)
        self.model = load_model(AutoModelForCausalLM, checkpoint, config)
        self.eos_token_ids = eos_token_ids(self.model.config, self.tokenizer)
        max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self.n_positions = clamp_n_positions(config.n_positions, max_positions, "model")
        self.n_slots = n_slots
        self.vocab_size = self.model.get_input_embeddings().num_embeddings
        self._forward_kwargs = ForwardKwargs(self.model)
        self.adapters = HFAdapters(self.model)
        self._slots: dict[int, _Slot] = {}
        self._batch: _Batch | None = None
        self.sampling = HostSampling(n_slots, self.eos_token_ids, self.n_positions, self.tokenizer, self.vocab_size)

    # -- the contract ------------------------------------------------------------------

    @property
    def sampling_s(self) -> float:
        return self.sampling.seconds

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        return self.sampling.refusal(request)

    def lora_shapes(self) -> dict[str, tuple[int, int]]:
        return dict(self.adapters.shapes)

    def load_adapter(self, spec: AdapterSpec) -> None:
        self.adapters.load(spec)

    def unload_adapter(self, name: str) -> None:
        users = sorted(slot for slot, state in self._slots.items() if state.adapter == name)
        if users:
            raise ValueError(f"LoRA adapter {name!r} is in use by slots {users}; release them first")
        self.adapters.unload(name)

    def slot_adapter(self, slot: int) -> str | None:
        state = self._slots.get(slot)
        return None if state is None else state.adapter

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        """Each request alone (batch 1, no padding). All or nothing: if one fails, none of
        this call's slots stays occupied."""
        self._check_prefill(requests)
        if not requests:
            return []
        done: list[SlotRequest] = []
        try:
            with torch.inference_mode():
                prompt_logits = []
                for request in requests:
                    prompt_logits.append(self._prefill_one(request))
                    done.append(request)
                last_logits = torch.stack([logits[-1] for logits in prompt_logits])
                choices = self.sampling.first_tokens(requests, last_logits)
                for i, (request, logits) in enumerate(zip(requests, prompt_logits, strict=True)):
                    self._slots[request.slot].next_token = choices[i].token_id
                    if request.prompt_logprobs:
                        prompt = prompt_logprobs(logits, request.prompt_ids, request.logprobs or 0)
                        choices[i] = dataclasses.replace(choices[i], prompt=prompt)
        except BaseException:
            for request in done:
                self.release(request.slot)
            raise
        return choices

    def decode_plan(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """Without proposals, `decode`'s one token a row (the base contract's step call); with them,
        the same forward taking the proposals it can verify (`_step`)."""
        self.check_row_adapters(rows)
        if not any(row.proposal for row in rows):
            return [[choice] for choice in self.decode([row.slot for row in rows])]
        return self._step(rows)

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        return [tokens[0] for tokens in self._step([DecodeRow(slot) for slot in slots])]

    def _step(self, rows: Sequence[DecodeRow]) -> list[list[TokenChoice]]:
        """One forward over the rows: each row's next token, and after it the tokens proposed for
        it (speculation; padded to the longest, pads masked). The sampler then picks position by
        position over the rows still going (`take_verified`): a row takes its pick at each position
        while the pick equals the proposal there, then the one after, every pick made exactly as a
        step of its own would make it (greedy or sampled, shaped, constrained). The positions of
        rejected proposals stay in the stacked cache, masked out, until the next restack drops them."""
        slots = tuple(row.slot for row in rows)
        self._check_live(slots)
        if not slots:
            return []
        proposals = {row.slot: row.proposal for row in rows}
        with torch.inference_mode():
            batch = self._batch
            longest = max(self._slots[slot].length for slot in slots)
            if batch is None or not batch.reusable_for(slots) or batch.mostly_holes(longest):
                batch = self._restack(slots)
            states = [self._slots[slot] for slot in batch.slots]
            width = batch.mask.shape[1]
            span = 1 + max(len(proposals[slot]) for slot in batch.slots)
            pads = [span - 1 - len(proposals[slot]) for slot in batch.slots]
            ids = [
                [s.next_token, *proposals[slot], *[0] * pad]
                for slot, s, pad in zip(batch.slots, states, pads, strict=True)
            ]
            fresh = [[1] * (span - pad) + [0] * pad for pad in pads]
            mask = torch.cat([batch.mask, torch.tensor(fresh, dtype=torch.long)], dim=1)
            lengths = torch.tensor([[state.length] for state in states], dtype=torch.long)
            try:
                out = self.adapters.forward(
                    [state.adapter for state in states],
                    input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=mask,
                    position_ids=lengths + torch.arange(span, dtype=torch.long),
                    **self._forward_kwargs(batch.cache, last_only=span == 1),
                )
                picked = take_verified([proposals[slot] for slot in batch.slots], self._picker(batch.slots, out.logits))
            except BaseException:
                batch.cache = truncate(batch.cache, width)  # what the layers before a failure appended
                raise
            taken = dict(zip(batch.slots, picked, strict=True))
            for i, (slot, state) in enumerate(zip(batch.slots, states, strict=True)):
                count = len(taken[slot])  # the next token and the accepted proposals are in the cache now
                if count < span:
                    mask[i, width + count :] = 0
                state.length += count
                state.next_token = taken[slot][-1].token_id
            batch.mask = mask
        return [taken[slot] for slot in slots]

    def _picker(self, slots: tuple[int, ...], logits: torch.Tensor) -> Pick:
        """`take_verified`'s pick over a forward's logits [rows, positions, vocab], row i = slots[i]."""

        def pick(rows: list[int], position: int) -> list[TokenChoice]:
            at = logits[:, position] if len(rows) == len(slots) else logits[torch.tensor(rows), position]
            return self.sampling.next_tokens([slots[row] for row in rows], at)

        return pick

    def release(self, slot: int) -> None:
        """Forget the slot's sequence; releasing a free slot is a no-op."""
        self._check_slot(slot)
        self.sampling.release(slot)
        if self._slots.pop(slot, None) is None:
            return
        if self._batch is not None and slot in self._batch.slots:
            self._batch.stale.add(slot)  # its row stays until the next decode restacks without it
            if len(self._batch.stale) == len(self._batch.slots):
                self._batch = None

    def warmup(self) -> None:
        if 0 in self._slots:
            raise ValueError("warmup needs slot 0 free")
        self.sampling.warmup()
        prompt = tuple(self.encode("Hello, world")) or (0,)
        self.prefill([SlotRequest(slot=0, prompt_ids=prompt[: self.n_positions - 3], ignore_eos=True)])
        try:
            for _ in range(2):
                self.decode([0])
        finally:
            self.release(0)

    def close(self) -> None:
        self._slots.clear()
        self._batch = None
        self.adapters.close()
        self.model = None

    # -- internals ---------------------------------------------------------------------

    def _prefill_one(self, request: SlotRequest) -> torch.Tensor:
        """Runs the prompt into the slot's own cache; its logits ([positions, vocab]: every
        position with prompt logprobs, else the last)."""
        n = len(request.prompt_ids)
        cache = DynamicCache()
        out = self.adapters.forward(
            [request.adapter_id],
            input_ids=torch.tensor([request.prompt_ids], dtype=torch.long),
            attention_mask=torch.ones((1, n), dtype=torch.long),
            position_ids=torch.arange(n, dtype=torch.long).unsqueeze(0),
            **self._forward_kwargs(cache, last_only=not request.prompt_logprobs),
        )
        self._slots[request.slot] = _Slot(n, -1, layers_of(cache), request.adapter_id)
        return out.logits[0]

    def _restack(self, slots: tuple[int, ...]) -> _Batch:
        """A new stacked batch of `slots`; every slot's K/V is copied into it once."""
        old = self._batch
        if old is not None:
            # A live row of the old batch that is not decoded now keeps its K/V as its own.
            for slot in old.slots:
                state = self._slots.get(slot)
                if slot not in old.stale and slot not in slots and state is not None and state.kv is None:
                    state.kv = [(k.clone(), v.clone()) for k, v in old.row_kv(slot, state.length)]
        rows = []
        for slot in slots:
            state = self._slots[slot]
            if state.kv is not None:
                rows.append(state.kv)
            else:
                assert old is not None and slot in old.slots and slot not in old.stale
                rows.append(old.row_kv(slot, state.length))
        lengths = [self._slots[slot].length for slot in slots]
        room = min(max(16, max(lengths) // 2), self.n_positions)  # steps before the buffers must grow
        buffers, mask = stack(rows, lengths, room)
        for slot in slots:
            self._slots[slot].kv = None
        self._batch = _Batch(slots, AppendCache(buffers, mask.shape[1]), mask)
        return self._batch

    def _check_slot(self, slot: int) -> None:
        if not isinstance(slot, int) or not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot!r} is out of range: this backend has slots 0..{self.n_slots - 1}")

    def _check_live(self, slots: Sequence[int]) -> None:
        for slot in slots:
            self._check_slot(slot)
            if slot not in self._slots:
                raise ValueError(f"slot {slot} holds no sequence: it was never prefilled, or was released")
        if len(set(slots)) != len(slots):
            raise ValueError(f"decode got a slot twice: {list(slots)}")

    def _check_prefill(self, requests: Sequence[SlotRequest]) -> None:
        """Every request is checked before any runs: a bad one changes no slot."""
        seen: set[int] = set()
        for request in requests:
            self._check_slot(request.slot)
            if request.slot in self._slots or request.slot in seen:
                raise ValueError(f"slot {request.slot} is occupied; release it before prefilling it again")
            seen.add(request.slot)
            if not request.prompt_ids:
                raise ValueError(f"slot {request.slot}: the prompt has no tokens")
            if len(request.prompt_ids) > self.n_positions:
                raise ValueError(
                    f"slot {request.slot}: the prompt has {len(request.prompt_ids)} tokens, above n_positions "
                    f"({self.n_positions})"
                )
            bad = [t for t in request.prompt_ids if not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(f"slot {request.slot}: token ids {bad[:5]} are outside the vocabulary")
            if request.adapter_id is not None and request.adapter_id not in self.adapters:
                raise SlotRequestError(request.slot, f"the LoRA adapter {request.adapter_id!r} is not loaded", "model")
