"""Mirrors src/transformers_neuronx/config.py: ContinuousBatchingConfig, NeuronConfig and
QuantizationConfig.

Same keyword names and defaults as the real classes; like them, NeuronConfig rejects an
unknown keyword (and a bad cast_logits_dtype, padding_side, qkv_tiling without fuse_qkv,
...) with an AssertionError and QuantizationConfig an unknown dtype or method with
NotImplementedError. Options are stored; NeuronConfig derives `lhs_aligned` /
`padding_side` as the real one does (continuous batching forces right padding with 2-D
cache ids, whatever else was given), and the model (base.py) acts on continuous batching.
"""

from __future__ import annotations

import warnings
from typing import Any

from transformers_neuronx.constants import GQA, Layout

VALID_DTYPES = ("float32", "float16", "bfloat16")


class QuantizationConfig:
    def __init__(
        self,
        quant_dtype: str = "s8",
        dequant_dtype: str = "f16",
        quantize_method: str = "vector_dynamic",
        quantize_attn: bool = True,
        no_quantize_list: list[str] | None = None,
    ) -> None:
        if quant_dtype not in ("s8", "f8e4m3fn"):
            raise NotImplementedError(f"{quant_dtype} is not implemented")
        if quantize_method not in ("vector_dynamic", "direct_cast"):
            raise NotImplementedError(f"{quantize_method} is not implemented")
        self.quant_dtype = quant_dtype
        self.dequant_dtype = dequant_dtype
        self.quantize_method = quantize_method
        self.quantize_attn = quantize_attn
        self.no_quantize_list = list(no_quantize_list or [])

    def describe(self) -> dict[str, Any]:
        return dict(vars(self))


class ContinuousBatchingConfig:
    """Same keywords as the real one (`max_num_seqs`, older spelling `batch_size_for_shared_caches`,
    `max_model_len`, `optimized_paged_attention`, `enable_chunked_prefill`): without a number of
    sequences it raises KeyError, an unknown keyword asserts, chunked prefill without optimized
    paged attention asserts. `block_size` / `num_blocks` stay None until vLLM's
    `init_cache_engine` (paged attention, which the fake does not model)."""

    def __init__(self, **kwargs: Any) -> None:
        if kwargs.get("max_num_seqs") is not None:
            self.max_num_seqs = kwargs.pop("max_num_seqs")
        else:
            self.max_num_seqs = kwargs.pop("batch_size_for_shared_caches")
        self.max_model_len = kwargs.pop("max_model_len", None)
        self.optimized_paged_attention = bool(kwargs.pop("optimized_paged_attention", False))
        self.enable_chunked_prefill = bool(kwargs.pop("enable_chunked_prefill", False))
        if self.enable_chunked_prefill:
            assert self.optimized_paged_attention, "chunked prefill is only supported with optimized paged attention"
        self.block_size: int | None = None
        self.num_blocks: int | None = None
        assert len(kwargs) == 0, f"unexpected key word arguments: {kwargs.keys()}"

    @property
    def batch_size_for_shared_caches(self) -> int:
        return self.max_num_seqs

    def describe(self) -> dict[str, Any]:
        return dict(vars(self))


class NeuronConfig:
    """The checks run in the real order, so the same keyword fails first. lhs_aligned (right-padded
    rows, 2-D cache ids) is derived as the real one derives it: padding_side == 'right', then the
    deprecated `use_2d_cache_ids` and `lhs_aligned` keywords override it (in that order), and
    continuous batching forces it on with padding_side 'right'."""

    def __init__(
        self,
        *,
        sparse_attn: Any = None,
        quant: QuantizationConfig | None = None,
        kv_cache_quant: Any = None,
        continuous_batching: ContinuousBatchingConfig | None = None,
        attention_layout: Layout = Layout.HSB,
        collectives_layout: Layout = Layout.HSB,
        cache_layout: Layout = Layout.SBH,
        padding_side: str = "left",
        group_query_attention: GQA | str | None = None,
        sequence_parallel_norm: bool = False,
        sequence_parallel_norm_threshold: int = 2048,
        bf16_rms_norm: bool = False,
        on_device_embedding: bool = False,
        on_device_generation: Any = None,
        all_reduce_dtype: str | None = None,
        cast_logits_dtype: str = "float32",
        fuse_qkv: bool = False,
        qkv_tiling: bool = False,
        weight_tiling: bool = False,
        mlp_in_weight_tiling_permute_order: list[int] | None = None,
        mlp_out_weight_tiling_permute_order: list[int] | None = None,
        log_softmax_scores: bool = False,
        shard_over_sequence: bool = False,
        output_all_logits: bool = False,
        attn_output_transposed: bool = False,
        fused_rmsnorm_qkv: bool = False,
        fused_rmsnorm_mlp: bool = False,
        mlp_out_weight_transpose: bool = False,
        fuse_mlp: bool = False,
        is_eagle_target: bool = False,
        is_eagle_draft: bool = False,
        has_pre_attention_norm: bool = True,
        compilation_worker_count: int | None = None,
        duplicate_q_weight_sos: bool = False,
        **kwargs: Any,
    ) -> None:
        self.all_reduce_dtype = all_reduce_dtype
        self.sparse_attn = sparse_attn
        self.quant = quant
        self.kv_cache_quant = kv_cache_quant
        self.cast_logits_dtype = cast_logits_dtype
        assert cast_logits_dtype in VALID_DTYPES, (
            f"The `cast_logits_dtype={cast_logits_dtype}` argument must be one of {list(VALID_DTYPES)}"
        )
        self.fuse_qkv = fuse_qkv
        self.fuse_mlp = fuse_mlp
        self.continuous_batching = continuous_batching
        self.padding_side = padding_side
        assert padding_side in ("left", "right"), (
            f"The `padding_side={padding_side}` argument must be either 'left' or 'right'"
        )
        self.lhs_aligned = padding_side == "right"
        if "use_2d_cache_ids" in kwargs:
            warnings.warn("NeuronConfig `use_2d_cache_ids` argument is deprecated.", stacklevel=2)
            self.lhs_aligned = kwargs.pop("use_2d_cache_ids", False)
        if "lhs_aligned" in kwargs:
            warnings.warn("NeuronConfig `lhs_aligned` argument is deprecated.", stacklevel=2)
            self.lhs_aligned = kwargs.pop("lhs_aligned", False)
        if self.continuous_batching:
            self.lhs_aligned = True
            self.padding_side = "right"
        self.attention_layout = attention_layout
        self.collectives_layout = collectives_layout
        self.cache_layout = cache_layout
        self.log_softmax_scores = log_softmax_scores
        self.group_query_attention = None if group_query_attention is None else GQA(group_query_attention)
        self.sequence_parallel_norm = sequence_parallel_norm
        self.sequence_parallel_norm_threshold = sequence_parallel_norm_threshold
        assert sequence_parallel_norm_threshold > 0, (
            f"sequence_parallel_norm_threshold={sequence_parallel_norm_threshold} must be greater than zero"
        )
        self.bf16_rms_norm = bf16_rms_norm
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.qkv_tiling = qkv_tiling
        if self.qkv_tiling is True:
            assert self.fuse_qkv is True, "QKV weight tiling is currently only supported when QKV fusion is enabled."
        self.weight_tiling = weight_tiling
        self.mlp_in_weight_tiling_permute_order = list(mlp_in_weight_tiling_permute_order or [1, 2, 0, 3])
        self.mlp_out_weight_tiling_permute_order = list(mlp_out_weight_tiling_permute_order or [1, 2, 0, 3])
        for order in (self.mlp_in_weight_tiling_permute_order, self.mlp_out_weight_tiling_permute_order):
            assert order.index(2) < order.index(3), "original dim 2 has to be front of dim 3 after applying the order"
        self.output_all_logits = output_all_logits
        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        self.shard_over_sequence = shard_over_sequence
        self.attn_output_transposed = attn_output_transposed
        self.fused_rmsnorm_qkv = fused_rmsnorm_qkv
        self.fused_rmsnorm_mlp = fused_rmsnorm_mlp
        self.mlp_out_weight_transpose = mlp_out_weight_transpose
        if self.shard_over_sequence:
            assert self.sparse_attn is None, "sparse attn is not supported with flash decoding"
            if not (self.continuous_batching and self.continuous_batching.optimized_paged_attention):
                assert self.cache_layout == Layout.SBH, f"flash decoding only support SBH layout , got {cache_layout}"
        self.duplicate_q_weight_sos = duplicate_q_weight_sos
        self.is_eagle_target = is_eagle_target
        self.is_eagle_draft = is_eagle_draft
        self.has_pre_attention_norm = has_pre_attention_norm
        self.compilation_worker_count = compilation_worker_count

    @property
    def use_2d_cache_ids(self) -> bool:
        return self.lhs_aligned

    @property
    def vectorize_last_token_id(self) -> bool:
        return self.lhs_aligned

    def is_pp(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        """What the compiled programs depend on (the real HLO hash covers these)."""
        out: dict[str, Any] = {}
        for key, value in sorted(vars(self).items()):
            if isinstance(value, (QuantizationConfig, ContinuousBatchingConfig)):
                value = value.describe()
            elif hasattr(value, "value"):
                value = value.value
            out[key] = value
        return out
