"""Mirrors src/transformers_neuronx/config.py: NeuronConfig and QuantizationConfig.

Same keyword names and defaults as the real classes; like them, NeuronConfig rejects an
unknown keyword with an AssertionError and QuantizationConfig an unknown dtype or method
with NotImplementedError. Options are stored, not acted on.
"""

from __future__ import annotations

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


class NeuronConfig:
    def __init__(
        self,
        *,
        sparse_attn: Any = None,
        quant: QuantizationConfig | None = None,
        kv_cache_quant: Any = None,
        continuous_batching: Any = None,
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
        log_softmax_scores: bool = False,
        shard_over_sequence: bool = False,
        output_all_logits: bool = False,
        attn_output_transposed: bool = False,
        fused_rmsnorm_qkv: bool = False,
        fused_rmsnorm_mlp: bool = False,
        mlp_out_weight_transpose: bool = False,
        fuse_mlp: bool = False,
        has_pre_attention_norm: bool = True,
        compilation_worker_count: int | None = None,
        duplicate_q_weight_sos: bool = False,
        **kwargs: Any,
    ) -> None:
        assert cast_logits_dtype in VALID_DTYPES, f"cast_logits_dtype must be one of {VALID_DTYPES}"
        assert padding_side in ("left", "right"), "padding_side must be 'left' or 'right'"
        self.lhs_aligned = bool(kwargs.pop("use_2d_cache_ids", False) or kwargs.pop("lhs_aligned", False))
        assert len(kwargs) == 0, f"Unexpected NeuronConfig keyword arguments: {kwargs}"
        self.sparse_attn = sparse_attn
        self.quant = quant
        self.kv_cache_quant = kv_cache_quant
        self.continuous_batching = continuous_batching
        self.attention_layout = attention_layout
        self.collectives_layout = collectives_layout
        self.cache_layout = cache_layout
        self.padding_side = padding_side
        self.group_query_attention = None if group_query_attention is None else GQA(group_query_attention)
        self.sequence_parallel_norm = sequence_parallel_norm
        self.sequence_parallel_norm_threshold = sequence_parallel_norm_threshold
        self.bf16_rms_norm = bf16_rms_norm
        self.on_device_embedding = on_device_embedding
        self.on_device_generation = on_device_generation
        self.all_reduce_dtype = all_reduce_dtype
        self.cast_logits_dtype = cast_logits_dtype
        self.fuse_qkv = fuse_qkv
        self.qkv_tiling = qkv_tiling
        self.weight_tiling = weight_tiling
        self.log_softmax_scores = log_softmax_scores
        self.shard_over_sequence = shard_over_sequence
        self.output_all_logits = output_all_logits
        self.attn_output_transposed = attn_output_transposed
        self.fused_rmsnorm_qkv = fused_rmsnorm_qkv
        self.fused_rmsnorm_mlp = fused_rmsnorm_mlp
        self.mlp_out_weight_transpose = mlp_out_weight_transpose
        self.fuse_mlp = fuse_mlp
        self.has_pre_attention_norm = has_pre_attention_norm
        self.compilation_worker_count = compilation_worker_count
        self.duplicate_q_weight_sos = duplicate_q_weight_sos

    @property
    def use_2d_cache_ids(self) -> bool:
        return self.lhs_aligned

    def is_pp(self) -> bool:
        return False

    def describe(self) -> dict[str, Any]:
        """What the compiled programs depend on (the real HLO hash covers these)."""
        out: dict[str, Any] = {}
        for key, value in sorted(vars(self).items()):
            if isinstance(value, QuantizationConfig):
                value = value.describe()
            elif hasattr(value, "value"):
                value = value.value
            out[key] = value
        return out
