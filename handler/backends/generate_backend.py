"""Shared `generate` path for backends whose model exposes Hugging Face `generate`.

The `hf` backend's AutoModelForCausalLM and the `neuronx` backend's
HuggingFaceGenerationModelAdapter both do; so the same micro-batching and streaming
path serves both. A static-batch model (Neuron) gets its micro-batch padded to the
compiled batch size with rows that stop at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import LogitsProcessorList, StoppingCriteriaList

from handler.backends.base import Backend, RowSpec
from handler.generation import RowStoppingCriteria, RowwiseSampler, left_pad


class GenerateBackend(Backend):
    generation_model: Any
    pad_token_id: int

    def generate(self, rows: Sequence[RowSpec], streamer: Any, is_finished: Callable[[int], bool]) -> None:
        padded: list[RowSpec | None] = list(rows)
        if self.static_batch_size is not None:
            padded += [None] * (self.static_batch_size - len(rows))
        prompts = [row.prompt_ids if row else rows[0].prompt_ids[-1:] for row in padded]
        input_ids, attention_mask = left_pad(prompts, self.pad_token_id)
        budget = self.n_positions - input_ids.shape[1]
        max_new_tokens = [min(row.max_new_tokens, budget) if row else 0 for row in padded]
        stopping = RowStoppingCriteria(max_new_tokens, input_ids.shape[1], lambda i: i >= len(rows) or is_finished(i))
        with torch.inference_mode():
            self.generation_model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max(max_new_tokens),
                do_sample=False,
                logits_processor=LogitsProcessorList([RowwiseSampler(padded, self.eos_token_ids)]),
                stopping_criteria=StoppingCriteriaList([stopping]),
                streamer=streamer,
                pad_token_id=self.pad_token_id,
                eos_token_id=sorted(self.eos_token_ids),
            )
