"""Per-layer K/V of a transformers `DynamicCache`, read and written the same way on
transformers 5.x (`cache.layers[i].keys / .values`) and 4.4x, the Neuron SDK's pin
(`cache.key_cache[i] / .value_cache[i]`), plus the forward keyword names that differ
between them (`cache=` / `past_key_values=`, `logits_to_keep=` / `num_logits_to_keep=`).

A layer's K/V is a pair of tensors `[batch, kv_heads, length, head_dim]`. Rows of one
stacked cache are left-padded to a common length (zeros, masked out by the attention
mask); `stack` and `unpad_row` convert between one sequence's K/V and such a batch.

`AppendCache` is a DynamicCache whose layers live in buffers with room to grow: a decode
step writes its new column in place, where DynamicCache concatenates (copies every
layer's whole K/V, every step: ~10 % of a CPU decode step at a few hundred positions, and
growing with the length).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

LayerKV = tuple[torch.Tensor, torch.Tensor]


def layers_of(cache: Any) -> list[LayerKV]:
    """Each layer's (keys, values) of a DynamicCache, without copying."""
    if hasattr(cache, "layers"):  # transformers 5.x
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))  # transformers 4.4x


def cache_of(layers: Sequence[LayerKV]) -> DynamicCache:
    """A DynamicCache holding `layers` (through the public `update`, so every version
    keeps its own bookkeeping, e.g. 4.4x's seen-token count)."""
    cache = DynamicCache()
    for index, (keys, values) in enumerate(layers):
        cache.update(keys, values, index)
    return cache


def truncate(cache: Any, length: int) -> Any:
    """The cache cut back to its first `length` positions in every layer: what it held
    before a forward that failed part-way (some layers appended, others not). `crop` is
    not used: it means 'keep n' on 4.4x and 'remove n' on 5.x."""
    if isinstance(cache, AppendCache):
        cache.truncate(length)
        return cache
    return cache_of([(keys[..., :length, :], values[..., :length, :]) for keys, values in layers_of(cache)])


def _set_layer(cache: Any, index: int, keys: torch.Tensor, values: torch.Tensor) -> None:
    if hasattr(cache, "layers"):  # transformers 5.x
        cache.layers[index].keys, cache.layers[index].values = keys, values
    else:  # transformers 4.4x
        cache.key_cache[index], cache.value_cache[index] = keys, values
        if index == 0:
            cache._seen_tokens = keys.shape[-2]


class AppendCache(DynamicCache):
    """A DynamicCache over preallocated buffers (`[batch, kv_heads, capacity, head_dim]`
    per layer, the first `length` positions filled). The model sees exactly what a
    DynamicCache would show it (each layer's K/V is a view of its first positions), but
    `update` writes the new positions in place; a buffer that runs out of room grows by
    half (amortized O(1) per position)."""

    def __init__(self, buffers: Sequence[LayerKV], length: int) -> None:
        super().__init__()
        self._buffers = [tuple(pair) for pair in buffers]
        self._lengths = [length] * len(self._buffers)
        for index, (keys, values) in enumerate(self._buffers):
            # The parent's update creates the layer with the right dtype and device (from empty tensors).
            DynamicCache.update(self, keys[..., :0, :], values[..., :0, :], index)
            self._expose(index)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self._lengths[layer_idx]
        end = start + key_states.shape[-2]
        keys, values = self._buffers[layer_idx]
        if end > keys.shape[-2]:
            keys, values = (_grown(part, start, end + max(16, end // 2)) for part in (keys, values))
            self._buffers[layer_idx] = (keys, values)
        keys[..., start:end, :] = key_states
        values[..., start:end, :] = value_states
        self._lengths[layer_idx] = end
        return self._expose(layer_idx)

    def truncate(self, length: int) -> None:
        for index in range(len(self._buffers)):
            self._lengths[index] = min(self._lengths[index], length)
            self._expose(index)

    def _expose(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        length = self._lengths[index]
        keys, values = self._buffers[index]
        keys, values = keys[..., :length, :], values[..., :length, :]
        _set_layer(self, index, keys, values)
        return keys, values


def _grown(buffer: torch.Tensor, filled: int, capacity: int) -> torch.Tensor:
    out = buffer.new_zeros((*buffer.shape[:-2], capacity, buffer.shape[-1]))
    out[..., :filled, :] = buffer[..., :filled, :]
    return out


def unpad_row(layers: Sequence[LayerKV], row: int, pad: int) -> list[LayerKV]:
    """One row of a stacked cache without its left padding, as a batch of one (views)."""
    return [(keys[row : row + 1, :, pad:], values[row : row + 1, :, pad:]) for keys, values in layers]


def stack(
    rows: Sequence[Sequence[LayerKV]], lengths: Sequence[int], room: int = 0
) -> tuple[list[LayerKV], torch.Tensor]:
    """Left-pad each row's K/V (a batch of one, `lengths[i]` positions) to the longest and
    stack them, in tensors with `room` more positions (zeros) after the longest; with the
    [batch, longest] attention mask (0 on the padding)."""
    longest = max(lengths)
    mask = torch.zeros((len(rows), longest), dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, longest - length :] = 1
    stacked: list[LayerKV] = []
    for layer in range(len(rows[0])):
        pair = []
        for part in (0, 1):
            sample = rows[0][layer][part]
            _, heads, _, head_dim = sample.shape
            out = sample.new_zeros((len(rows), heads, longest + room, head_dim))
            for row, length in enumerate(lengths):
                out[row, :, longest - length : longest] = rows[row][layer][part][0, :, -length:]
            pair.append(out)
        stacked.append((pair[0], pair[1]))
    return stacked, mask


class ForwardKwargs:
    """The model's own names for the cache and logits-to-keep arguments of `forward`."""

    def __init__(self, model: torch.nn.Module) -> None:
        params = inspect.signature(model.forward).parameters
        self.cache = "cache" if "cache" in params else "past_key_values"
        self.logits_to_keep: str | None = next(
            (name for name in ("logits_to_keep", "num_logits_to_keep") if name in params), None
        )

    def __call__(self, cache: Any, last_only: bool = True) -> dict[str, Any]:
        kwargs: dict[str, Any] = {self.cache: cache, "use_cache": True}
        if last_only and self.logits_to_keep is not None:
            kwargs[self.logits_to_keep] = 1
        return kwargs
