"""A roofline model of one Inferentia2 model step, from the checkpoint's shape and the layout
(no SDK, no device): what the capacity planner (`make plan`, scripts/plan/planner.py) runs its
discrete-event simulation on.

Per NeuronCore (every core of a tp group does the same share of the work, in parallel):

    decode(rows, kv_positions) = weight bytes / (HBM bandwidth x bandwidth_efficiency)
                                 + rows x kv_positions x KV bytes per position
                                   / (HBM bandwidth x kv_bandwidth_efficiency)
                                 + layers x layer_overhead + rows x row_overhead
                                 + int8 weight bytes / HBM bandwidth x int8_upcast
    prefill(rows, tokens)      = prefill_overhead
                                 + rows x weight bytes / (HBM bandwidth x prefill_bandwidth_efficiency)
                                 + matrix FLOPs / (bf16 peak x compute_efficiency)
                                 + attention FLOPs / (bf16 peak x attention_efficiency)

- Weight bytes: what one core reads per step: its share of every decoder layer's q, k, v, o,
  gate, up and down matrices (with the SDK's head padding and GQA replication at this
  tp_degree, handler/neuron/memory.py's rules) plus its share of the lm_head. The input
  embedding is a row gather, not a read of the table, and the norms are negligible. int8
  weights: the layers' matrices take one byte each, the lm_head stays 16-bit (as memory.py).
- int8_upcast: what int8 weights cost beyond reading them, per int8 byte and step. The SDK
  keeps int8 weight-only matrices in HBM and converts them to bf16 on the chip before each
  matrix multiply (a vector-engine pass over every weight, every step): halving the bytes
  does not halve the step. Fitted on one published int8 point; the published Llama-3-8B int8
  steps are about what its bf16 weights would take to read (6.42 ms at TP24 against Llama-2-
  7B bf16's 6.47 ms). Prefill leaves it out: there the conversion is spread over the
  prompt's tokens, and the published int8 prompts are within 5% without it.
- KV bytes per position: K and V of every layer for the KV heads one core holds. They have
  their own efficiency: the attention reads the cache as many small per-head tiles (one query
  row against every position), not as the long contiguous streams of the weight matrices; the
  published long-context steps cost about twice what the weights' efficiency gives their KV.
- A decode step computes every compiled row (the slots of a continuous-batching model, the
  batch of a static one: static shapes), so `rows` is the compiled batch, not the live rows.
  `kv_positions` is the token-generation bucket the step runs in (a power of two from 128 up
  to n_positions, transformers-neuronx's default buckets), which the attention reads whole.
- layer_overhead: what does not move with bytes, per layer: the two all-reduces of a
  tensor-parallel layer and the kernels' fixed costs. Per layer because a model with twice
  the layers has twice the collectives. row_overhead: per computed row (sampling, logits
  and the per-row work around the attention), measured, not derived.
- Prefill FLOPs per core: the matrix FLOPs, 2 x its matrix parameters x tokens (the lm_head
  on the last token of each row only), linear in the prompt; and the causal attention, 2 x
  layers x rows x tokens^2 x its Q heads x head_dim, quadratic, with its own efficiency: an
  attention that is not one fused kernel (transformers-neuronx's context encoding, what the
  calibration points ran) writes and softmaxes a tokens x tokens score matrix per head, work
  of the vector engines and HBM, far below the tensor engine's peak. The weight-read term is
  per row: a context kernel that takes one row at a time (transformers-neuronx under
  continuous batching) streams the weights once per row.

The hardware constants are the published peaks; the efficiencies and overheads are fitted
(least squares, `fit`) on published step times (profiles/published-points.yaml, through
handler/neuron/step_calibration.py) and validated on the published points not used.
What the model ignores: the latency of the collectives beyond a fixed per-layer cost (it
does not grow with tp_degree here), on-device sampling, the NKI kernels and compiler
versions (a newer SDK is faster at the same shape; a fused flash-attention kernel makes long
prompts far cheaper than the unfused attention calibrated here), the serving path's own
overhead, and the prompt padding inside a bucket beyond the bucket itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from handler.neuron.memory import DTYPE_BYTES, Layout, ModelShape, core_share, unquantized_bytes

# Inferentia2 chip: 820 GB/s of HBM bandwidth and 190 BF16 TFLOPS for its 2 NeuronCore-v2
# (awsdocs-neuron, general/arch/neuron-hardware/inferentia2: "190 FP16/BF16/cFP8/TF32 TFLOPS",
# "32GiB of HBM ... with 820 GiB/sec of bandwidth"; the inf2 instance table lists 9840 for the
# 12 chips of an inf2.48xlarge, the "9.8 TB/s" of the launch; the pages write GB/s and GiB/s
# for the same figure: taken here as 10^9 bytes). Per core: half of each.
HBM_BYTES_PER_S_PER_CORE = 820e9 / 2  # 0.41 TB/s
BF16_FLOPS_PER_CORE = 190e12 / 2  # 95 TFLOPS
SMALLEST_TOKEN_BUCKET = 128  # transformers-neuronx's default buckets start at 128


@dataclass(frozen=True)
class CoreWork:
    """What one NeuronCore of a tp group holds and moves for one model."""

    layers: int
    weight_bytes: float  # read once per decode step (layers' matrices + lm_head)
    int8_bytes: float  # of which int8 (the layers' matrices of an int8 model): converted every step
    kv_bytes_per_position: float  # one row, one position: K and V of every layer, this core's heads
    matrix_params: float  # the layers' matrices on this core (FLOPs per token / 2)
    lm_head_params: float  # this core's share of the lm_head
    attention_width: int  # Q heads on this core x head_dim

    @classmethod
    def of(
        cls,
        shape: ModelShape,
        tp_degree: int,
        weight_dtype: str = "bf16",
        kv_dtype: str = "bf16",
        sdk: str = "neuronx",
        gqa: str | None = None,
    ) -> CoreWork:
        # n_slots and n_positions do not change the head counts, except transformers-neuronx's
        # shard-over-batch, which needs n_slots divisible by tp: give it the tp_degree.
        layout = Layout(
            tp_degree=tp_degree,
            n_slots=tp_degree,
            n_positions=128,
            weight_dtype=weight_dtype,
            kv_dtype=kv_dtype,
            gqa=gqa,
            sdk=sdk,
        )
        share = core_share(shape, layout)
        matrix_bytes = share.layer_matrices * DTYPE_BYTES[weight_dtype]
        return cls(
            layers=shape.layers,
            weight_bytes=matrix_bytes + share.vocab_table * unquantized_bytes(weight_dtype, kv_dtype),
            int8_bytes=matrix_bytes if weight_dtype == "int8" else 0.0,
            kv_bytes_per_position=2 * shape.layers * share.kv_per_core * shape.head_dim * DTYPE_BYTES[kv_dtype],
            matrix_params=share.layer_matrices,
            lm_head_params=share.vocab_table,
            attention_width=share.q_heads // tp_degree * shape.head_dim,
        )


@dataclass(frozen=True)
class Calibration:
    """The fitted constants (handler/neuron/step_calibration.py fits them)."""

    bandwidth_efficiency: float  # decode: weight reads, achieved / peak HBM bandwidth
    kv_bandwidth_efficiency: float  # decode: KV-cache reads, achieved / peak HBM bandwidth
    layer_overhead_ms: float  # decode: fixed cost per layer and step
    row_overhead_ms: float  # decode: fixed cost per computed row and step
    int8_upcast: float  # decode: int8 weights' conversion, x the time their bytes take at peak HBM
    prefill_overhead_ms: float  # prefill: fixed cost per prefill call
    prefill_bandwidth_efficiency: float  # prefill: weight streaming, per row
    compute_efficiency: float  # prefill: matrix FLOPs, achieved / peak bf16 FLOPS
    attention_efficiency: float  # prefill: attention FLOPs (quadratic in the prompt), achieved / peak

    def decode_coefficients(self) -> tuple[float, float, float, float, float]:
        """What decode_features are multiplied by."""
        return (
            1 / self.bandwidth_efficiency,
            1 / self.kv_bandwidth_efficiency,
            self.layer_overhead_ms,
            self.row_overhead_ms,
            self.int8_upcast,
        )

    def prefill_coefficients(self) -> tuple[float, float, float, float]:
        """What prefill_features are multiplied by."""
        return (
            self.prefill_overhead_ms,
            1 / self.prefill_bandwidth_efficiency,
            1 / self.compute_efficiency,
            1 / self.attention_efficiency,
        )

    def describe(self) -> str:
        return (
            f"decode: weights at {self.bandwidth_efficiency:.0%} and KV at {self.kv_bandwidth_efficiency:.0%} "
            f"of peak HBM, {self.layer_overhead_ms * 1000:.0f} us per layer, "
            f"{self.row_overhead_ms * 1000:.0f} us per row, int8 conversion {self.int8_upcast:.2f} x "
            "the int8 bytes' read at peak; "
            f"prefill: {self.prefill_overhead_ms:.1f} ms + weights at "
            f"{self.prefill_bandwidth_efficiency:.0%} of peak HBM per row + matrix FLOPs at "
            f"{self.compute_efficiency:.1%} and attention FLOPs at {self.attention_efficiency:.1%} of peak bf16"
        )


# -- the two steps -----------------------------------------------------------------------
def decode_features(work: CoreWork, rows: int, kv_positions: float) -> tuple[float, float, float, float, float]:
    """(ms the weight bytes take at peak bandwidth, ms the KV bytes take at peak, layers, rows,
    ms the int8 bytes take at peak): decode_ms is their dot product with
    Calibration.decode_coefficients()."""
    kv_bytes = rows * kv_positions * work.kv_bytes_per_position
    to_ms = 1000 / HBM_BYTES_PER_S_PER_CORE
    return work.weight_bytes * to_ms, kv_bytes * to_ms, float(work.layers), float(rows), work.int8_bytes * to_ms


def prefill_features(work: CoreWork, rows: int, tokens: int) -> tuple[float, float, float, float]:
    """(1, ms the rows' weight reads take at peak bandwidth, ms the matrix FLOPs and ms the
    attention FLOPs take at peak): prefill_ms is their dot product with
    Calibration.prefill_coefficients(). `tokens`: the bucket each row is padded to."""
    matrix_flops = 2 * work.matrix_params * rows * tokens + 2 * work.lm_head_params * rows
    attention_flops = 2 * work.layers * rows * tokens * tokens * work.attention_width  # causal QK^T and AV
    weights_ms = rows * work.weight_bytes / HBM_BYTES_PER_S_PER_CORE * 1000
    to_ms = 1000 / BF16_FLOPS_PER_CORE
    return 1.0, weights_ms, matrix_flops * to_ms, attention_flops * to_ms


def decode_ms(work: CoreWork, rows: int, kv_positions: float, cal: Calibration) -> float:
    return _dot(decode_features(work, rows, kv_positions), cal.decode_coefficients())


def prefill_ms(work: CoreWork, rows: int, tokens: int, cal: Calibration) -> float:
    return _dot(prefill_features(work, rows, tokens), cal.prefill_coefficients())


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


# -- token buckets -----------------------------------------------------------------------
def token_bucket(length: int, n_positions: int) -> int:
    """The decode bucket of a step whose row holds `length` positions once this step's token is
    written (cache_id + 1): the smallest power of two >= length (at least 128), at most
    n_positions (transformers-neuronx's default token buckets, its find_bucket_id)."""
    bucket = SMALLEST_TOKEN_BUCKET
    while bucket < length:
        bucket *= 2
    return min(bucket, n_positions)


def mean_kv_positions(prompt_tokens: int, output_tokens: int, n_positions: int) -> float:
    """The bucket a row's decode steps read, averaged over its generation (rows in lock step).
    The prefill gives the first output token; decode step k (k = 1 .. output_tokens - 1) writes
    at cache_id prompt_tokens + k - 1, so its row holds prompt_tokens + k positions."""
    lengths = range(prompt_tokens + 1, prompt_tokens + max(2, output_tokens))
    return sum(token_bucket(n, n_positions) for n in lengths) / len(lengths)


# -- fitting -----------------------------------------------------------------------------
def fit(features: Sequence[Sequence[float]], targets_ms: Sequence[float]) -> tuple[float, ...]:
    """Least-squares coefficients: exact when there are as many independent points as unknowns."""
    a, b = np.asarray(features, dtype=float), np.asarray(targets_ms, dtype=float)
    if a.ndim != 2 or len(a) < a.shape[1]:
        raise ValueError(f"fit: {len(a)} point(s) for {a.shape[-1]} unknowns")
    solution, _, rank, _ = np.linalg.lstsq(a, b, rcond=None)
    if rank < a.shape[1]:
        raise ValueError("fit: the calibration points do not determine every constant (rank-deficient)")
    return tuple(float(x) for x in solution)
