"""Mirrors src/neuronx_distributed_inference/modules/generation/sampling.py (NxDI 0.8.16251,
SDK 2.28 commit cd3abf3): the host-side checks and the on-device sampler, on CPU.

- `sampling_params` is a float tensor (batch, 3): [top_k, top_p, temperature] per row.
  prepare_sampling_params(batch_size, top_k=[1], top_p=[1.0], temperature=[1.0]) builds one.
- validate_sampling_params(params, on_device_sampling_config) (host, before every forward
  with on-device sampling): shape[1] != 3, top_k not -1 and not within [0, global_topk],
  a non-integer top_k, top_p outside (0, 1], temperature < 0, or temperature 0 with top_k
  -1/0 raise ValueError. top_k -1 or 0 only logs a warning: it means *uniform* over the
  global_topk best candidates (the mask `arange >= top_k` masks every candidate).
- infer_sampling_params(params) (host, every forward): a row with temperature 0 gets
  top_k = 1 and top_p = 1, **in place** (the caller's tensor changes).
- Sampler (traced into the model): without do_sample and without dynamic it is argmax,
  whatever the params say. Otherwise: the global_topk best logits (sorted), those at rank
  >= the row's top_k set to -3000, divided by the row's temperature only if `dynamic` or
  the trace-time example had a temperature != 1 (the example is the config's
  top_k/top_p/temperature with do_sample, else all ones: a Python `if` on a traced tensor
  is decided once, at trace time), top-p masking (cumulative probability > max(min cumsum,
  top_p), the best candidate always kept) only if `dynamic` or the trace-time top_p < 1,
  softmax, then inverse-CDF sampling with a uniform draw (0.5 when deterministic). No seed
  input: the device draws from its own generator (the fake: a torch.Generator seeded once
  at load()). Tokens come back int32, shape (batch,).
- mask_padded_logits(logits, rank_id, world_size, pad_size): the last pad_size columns of
  the last rank's logits become finfo(float32).min (see model_base.py for where it bites).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

logger = logging.getLogger("Neuron")

IGNORED_LOGITS_VALUE = -3000


def mask_padded_logits(
    logits: torch.Tensor, rank_id: int, world_size: int, pad_size: int | None = None
) -> torch.Tensor:
    if not pad_size:
        return logits
    if rank_id != world_size - 1:
        return logits
    logits = logits.clone()
    logits[..., logits.shape[-1] - pad_size :] = torch.finfo(logits.dtype).min
    return logits


def validate_sampling_params(params: torch.Tensor, on_device_sampling_config: Any) -> None:
    if params.shape[1] != 3:
        raise ValueError(f"Expected tensor of shape (batch_size, 3), but got {params.shape}")
    params = params.to(torch.float32)
    top_k, top_p, temperature = params[:, 0], params[:, 1], params[:, 2]
    if isinstance(on_device_sampling_config, dict):
        global_top_k = on_device_sampling_config["global_topk"]
    else:
        global_top_k = on_device_sampling_config.global_topk
    valid_top_k = (top_k == -1) | ((top_k >= 0) & (top_k <= global_top_k))
    if not torch.all(valid_top_k):
        raise ValueError(
            "Invalid top-k values found. top-k must be -1 or greater than 0 but less than or equal to "
            f"{global_top_k=}. Found {top_k=}."
        )
    if torch.any(top_k == -1) or torch.any(top_k == 0):
        logger.warning(
            "In NxDI, top_k = -1 or top_k = 0 means randomly picking a token from the vocabulary with a uniform "
            "distribution."
        )
    if not torch.equal(top_k, top_k.floor()):
        raise ValueError(
            "Invalid top-k values found. top-k values should be able to be represented as integer values, but found "
            f"decimal parts. Found {top_k=}."
        )
    if not torch.all((top_p > 0.0) & (top_p <= 1.0)):
        raise ValueError(f"Invalid top-p values found. top-p must be in the range (0.0, 1.0]. Found {top_p=}.")
    if not torch.all(temperature >= 0.0):
        raise ValueError(
            f"Invalid temperature values found. Temperature must be greater than or equal to 0.0. Found {temperature=}."
        )
    if torch.any((temperature == 0.0) & ((top_k == -1) | (top_k == 0))):
        raise ValueError(
            "Invalid sampling parameters found. Temperature = 0 enables greedy sampling. Please set top_k to 1"
        )


def infer_sampling_params(params: torch.Tensor) -> torch.Tensor:
    for row in range(params.shape[0]):
        if params[row, 2] == 0:
            logger.warning("Temperature = 0 enables greedy sampling. Resetting top_k and top_p values to 1.")
            params[row, 0] = 1
            params[row, 1] = 1
    return params


def prepare_tensor(value: Any) -> torch.Tensor:
    if not torch.is_tensor(value):
        if not isinstance(value, list):
            value = [value]
        value = torch.tensor(value)
    return value


def prepare_sampling_params(
    batch_size: int,
    top_k: Any = [1],  # noqa: B006 - the real signature's defaults
    top_p: Any = [1.0],  # noqa: B006
    temperature: Any = [1.0],  # noqa: B006
) -> torch.Tensor:
    top_k, top_p, temperature = prepare_tensor(top_k), prepare_tensor(top_p), prepare_tensor(temperature)
    assert top_k.shape[0] == top_p.shape[0] == temperature.shape[0], (
        f"sampling params shapes don't match. Got top_k shape: {top_k.shape}, top_p shape: {top_p.shape}, "
        f"temperature shape: {temperature.shape}"
    )
    if top_k.shape[0] == 1:
        top_k = top_k.broadcast_to(batch_size)
        top_p = top_p.broadcast_to(batch_size)
        temperature = temperature.broadcast_to(batch_size)
    return torch.stack([top_k, top_p, temperature], dim=1)


def sample(
    logits: torch.Tensor,
    sampling_params: torch.Tensor,
    config: dict[str, Any],
    generator: torch.Generator,
) -> torch.Tensor:
    """The traced Sampler's forward on (batch, vocab) logits; `config` is the on-device sampling
    config as it was at trace time (what model.pt recorded)."""
    do_sample, dynamic = bool(config["do_sample"]), bool(config["dynamic"])
    if not (do_sample or dynamic):
        return torch.argmax(logits, dim=-1).to(torch.int32)
    # the Python branches of the real sampler were decided on the trace-time example inputs
    example_temperature = float(config["temperature"]) if do_sample else 1.0
    example_top_p = float(config["top_p"]) if do_sample else 1.0
    params = sampling_params.to(torch.float32)
    top_k, top_p, temperature = (params[:, i].reshape(-1, 1) for i in range(3))
    global_topk = int(config["global_topk"])
    if global_topk > 0:
        values, indices = torch.topk(logits, k=min(global_topk, logits.shape[-1]), dim=-1)
    else:
        values, indices = torch.sort(logits, dim=-1, descending=True)
    rank = torch.arange(values.shape[-1]).broadcast_to(values.shape)
    values = values.masked_fill(rank >= top_k, IGNORED_LOGITS_VALUE)
    if dynamic or example_temperature != 1.0:
        values = values / temperature
    if dynamic or example_top_p < 1.0:
        cumsum = torch.cumsum(torch.softmax(values, dim=-1), dim=-1)
        threshold = torch.max(torch.min(cumsum), top_p)
        mask = (cumsum > threshold).index_fill(-1, torch.tensor([0]), False)
        values = values.masked_fill(mask, IGNORED_LOGITS_VALUE)
    probs = torch.softmax(values, dim=-1)
    cumsum = torch.cumsum(probs, dim=-1)
    cumsum = cumsum / cumsum[..., -1:]
    cumsum[..., -1:] = 1
    if config.get("deterministic"):
        draw = torch.full((values.shape[0], 1), 0.5)
    else:
        draw = torch.rand((values.shape[0], 1), generator=generator)
    counts = torch.sum(draw > cumsum, dim=-1, keepdim=True)
    return torch.gather(indices, -1, counts).flatten().to(torch.int32)
