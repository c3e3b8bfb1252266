"""Mirrors HuggingFaceGenerationModelAdapter (src/transformers_neuronx/generation_utils.py).

Like the real class it subclasses only `PreTrainedModel`: on transformers >= 4.50
(and 5.x, which CI installs) it therefore has no `generate`, exactly as the real one.
The serving backend mixes in `GenerationMixin` itself where that is missing
(handler/backends/neuronx.py), so the fake stays faithful and that shim is tested.

Behaviour re-implemented: `generate` resets the step counter and runs Hugging Face
`generate`; `prepare_inputs_for_generation` turns the attention mask into `start_ids`
(the first real token of each left-padded row), sends the whole prompt with
`cache_ids = arange(T)` first, then only the last token with `cache_ids = [cur_len]`.
With `neuron_config.use_2d_cache_ids` (lhs_aligned) it does what the real one does for
right-padded rows instead: `start_ids = arange(batch)`, prefill `cache_ids = arange(T) *
attention_mask`, then `[batch, 1]` cache ids one past each row's largest.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from transformers import PreTrainedModel
from transformers.utils import ModelOutput


class HuggingFaceGenerationModelAdapter(PreTrainedModel):
    def __init__(self, config: Any, model: Any) -> None:
        if getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = "eager"
        super().__init__(config)
        self.model = model
        self.config = config
        self.cur_len = torch.zeros(1, dtype=torch.long)

    def reset_generation(self) -> None:
        self.cur_len = torch.zeros(1, dtype=torch.long)

    def forward(
        self,
        input_ids: torch.Tensor,
        cache_ids: torch.Tensor,
        start_ids: torch.Tensor | None = None,
        output_hidden_states: bool = False,
        output_attentions: bool = False,
        attention_mask: torch.Tensor | None = None,
        return_dict: bool = False,
    ) -> Any:
        if output_hidden_states or output_attentions or attention_mask is not None:
            warnings.warn("output_hidden_states, output_attentions and attention_mask are not used", stacklevel=2)
        logits = self.model(input_ids, cache_ids, start_ids)[:, None, :]
        if return_dict:
            return ModelOutput(logits=logits, past_key_values=())
        return (logits,)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self.reset_generation()
        return super().generate(*args, **kwargs)

    def prepare_inputs_for_generation(
        self, input_ids: torch.Tensor, past_key_values: Any = None, inputs_embeds: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        attention_mask = kwargs.get("attention_mask")
        start_ids = None
        if attention_mask is not None:
            start_ids = attention_mask.max(dim=1).indices.int()
        decoding = bool((self.cur_len > 0).any())
        if decoding:
            input_ids = input_ids[:, -1:]
        if self.model.neuron_config.use_2d_cache_ids:
            # right-padded rows: slot ids, and each row's own positions (arange times its mask)
            start_ids = torch.arange(input_ids.shape[0])
            if decoding:
                cache_ids = self.cur_len.unsqueeze(-1) + 1
                self.cur_len = cache_ids.squeeze(-1)
            else:
                if attention_mask is None:  # transformers 5 drops an all-ones mask; the real one needs < 4.50
                    attention_mask = torch.ones_like(input_ids)
                cache_ids = torch.arange(attention_mask.shape[1]) * attention_mask
                self.cur_len = cache_ids.max(dim=1).values
        elif decoding:
            cache_ids = self.cur_len
            self.cur_len = cache_ids + 1
        else:
            cache_ids = torch.arange(input_ids.shape[1])
            self.cur_len = torch.tensor([input_ids.shape[1]], dtype=torch.long)
        return {"input_ids": input_ids, "cache_ids": cache_ids, "start_ids": start_ids}
