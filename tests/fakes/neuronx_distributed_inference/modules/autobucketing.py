"""Mirrors the plain (no prefix caching, no chunked prefill, no batch bucketing) paths of
src/neuronx_distributed_inference/modules/autobucketing.py (NxDI 0.8.16251, SDK 2.28 commit
cd3abf3).

- generate_buckets(min_length, max_length): [max_length] when equal, else the powers of two
  2**i for i in range(int(log2(min)), round(log2(max))) followed by max_length, e.g.
  (128, 256) -> [128, 256], (128, 300) -> [128, 300], (128, 400) -> [128, 256, 400],
  (128, 100) -> [100].
- Context encoding: without enable_bucketing one bucket, max_context_length; with it,
  context_encoding_buckets if given (NeuronConfig sorted them), else
  generate_buckets(128, max_context_length).
- Token generation: the same with max_length and token_generation_buckets.
- Fused speculation (282-322): the token-generation buckets, by the same rule.
The choice of a bucket at run time is ModelWrapper's (models/model_wrapper.py).
"""

from __future__ import annotations

from math import log2
from typing import Any


def generate_buckets(min_length: int, max_length: int) -> list[int]:
    if min_length == max_length:
        return [max_length]
    min_bound = int(log2(min_length))
    max_bound = round(log2(max_length))
    return [2**i for i in range(min_bound, max_bound)] + [max_length]


def _unsupported(neuron_config: Any) -> None:
    if neuron_config.is_prefix_caching or neuron_config.is_chunked_prefill:
        raise NotImplementedError("fake NxD Inference: prefix caching / chunked prefill buckets are not modelled")
    if neuron_config.token_generation_batches is not None:
        raise NotImplementedError("fake NxD Inference: batch bucketing (token_generation_batches) is not modelled")


def generate_buckets_for_cte(inference_config: Any) -> list[int]:
    neuron_config = inference_config.neuron_config
    _unsupported(neuron_config)
    if not neuron_config.enable_bucketing:
        return generate_buckets(neuron_config.max_context_length, neuron_config.max_context_length)
    if neuron_config.context_encoding_buckets is not None:
        return neuron_config.context_encoding_buckets
    return generate_buckets(128, neuron_config.max_context_length)


def generate_buckets_for_tkg(inference_config: Any) -> list[int]:
    neuron_config = inference_config.neuron_config
    _unsupported(neuron_config)
    if not neuron_config.enable_bucketing:
        return generate_buckets(neuron_config.max_length, neuron_config.max_length)
    if neuron_config.token_generation_buckets is not None:
        return neuron_config.token_generation_buckets
    return generate_buckets(128, neuron_config.max_length)


def generate_buckets_for_fused_spec(inference_config: Any) -> list[int]:
    """autobucketing.py:282-322 (without prefix caching): the token-generation buckets."""
    return generate_buckets_for_tkg(inference_config)
