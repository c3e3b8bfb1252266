"""Sentence embeddings from an encoder's token states: sentence-transformers' pooling modes and its
Normalize module, on tensors. Pure functions: padding positions (mask 0) never count."""

from __future__ import annotations

from typing import Literal

import torch

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len", "lasttoken"]
POOLING_MODES: tuple[PoolingMode, ...] = ("cls", "mean", "max", "mean_sqrt_len", "lasttoken")


def pool(hidden: torch.Tensor, mask: torch.Tensor, mode: PoolingMode) -> torch.Tensor:
    """[rows, positions, dim] token states and their [rows, positions] attention mask (1 on real
    tokens) -> [rows, dim]. `cls`: the first position; `mean`: the mean over real tokens;
    `mean_sqrt_len`: their sum / sqrt(count); `max`: the maximum over real tokens; `lasttoken`: the
    last real token (left or right padding alike)."""
    if hidden.dim() != 3 or mask.shape != hidden.shape[:2]:
        raise ValueError(f"pool: hidden {tuple(hidden.shape)} and mask {tuple(mask.shape)} do not match")
    if mode == "cls":
        return hidden[:, 0]
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    if mode in ("mean", "mean_sqrt_len"):
        summed = (hidden * weights).sum(dim=1)
        counts = weights.sum(dim=1).clamp(min=1e-9)
        return summed / (counts if mode == "mean" else counts.sqrt())
    if mode == "max":
        floor = torch.finfo(hidden.dtype).min
        return hidden.masked_fill(weights == 0, floor).max(dim=1).values
    if mode == "lasttoken":
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        last = (positions * (mask > 0)).argmax(dim=1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ValueError(f"unknown pooling mode {mode!r}; known: {', '.join(POOLING_MODES)}")


def l2_normalize(vectors: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit length (a zero row stays zero), as sentence-transformers' Normalize."""
    return torch.nn.functional.normalize(vectors, p=2, dim=1)
