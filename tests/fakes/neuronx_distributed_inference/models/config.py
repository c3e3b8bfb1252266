"""Mirrors src/neuronx_distributed_inference/models/config.py of NxD Inference at the SDK 2.28
release commit cd3abf3 (NxDI 0.8.16251): NeuronConfig, OnDeviceSamplingConfig,
ChunkedPrefillConfig, InferenceConfig, FusedSpecNeuronConfig, to_dict / to_torch_dtype, CONFIG_FILE.

Same keyword names and defaults as the real classes, re-implemented (no code copied):
- NeuronConfig(**kwargs) pops every keyword it knows; one it does not know is only
  **logged** (`logging.warning("NeuronConfig init: Unexpected keyword arguments: {...}")`,
  not warnings.warn, not an error): a typo passes silently, so a caller must check its
  keywords itself. The real validations that raise, raise here with the same type and
  message: max_context_length > max_length, a context bucket above max_context_length or a
  token-generation bucket above max_length (AssertionError), cast_type, tp_degree not
  divisible by cp_degree / attention_dp_degree, tkg_batch_size not divisible by
  attention_dp_degree, attention DP without continuous batching, MLP CP without sequence
  parallel (ValueError / IncompatibleConfigError), quantized without a checkpoint path,
  chunked prefill without block KV, more than one token-generation attention kernel, ...
  Nothing here checks ctx_batch_size against batch_size or continuous batching: that fails
  later, when compile() traces the context-encoding model (see model_base.py).
- Defaults that matter for serving: batch_size 1; ctx_batch_size / tkg_batch_size /
  max_batch_size / kv_cache_batch_size default to batch_size; seq_len 128;
  max_context_length and max_length default to seq_len; enable_bucketing False;
  is_continuous_batching False; padding_side "right"; torch_dtype bfloat16 unless given
  (then `overrides_torch_dtype` is True and load_pretrained_config keeps it; otherwise the
  checkpoint's dtype replaces it); apply_seq_ids_mask False; skip_warmup False;
  save_sharded_checkpoint False; attn_kernel_enabled None; output_logits False.
- logical_nc_config: NEURON_LOGICAL_NC_CONFIG, else the `logical_nc_config` keyword, else the
  platform's (torch_neuronx.utils.get_platform_target(): 2 on trn2/trn3, else 1). Like the
  real one, every NeuronConfig() calls the deprecated module-level get_platform_lnc(),
  which emits a DeprecationWarning.
- lora_config: a LoraServingConfig (modules/lora_serving/config.py), or a dict turned into one
  (config.py:355-358, so reloading neuron_config.json re-checks the adapters' folders); with
  dynamic_multi_lora, ".*lora.*" is added to weights_to_skip_layout_optimization (562-564).
- OnDeviceSamplingConfig(**kwargs): do_sample False, top_k 1, top_p 1.0, temperature 1.0,
  dynamic False, deterministic False, global_topk 256, top_k_kernel_enabled False,
  sampling_dp_degree 1; unknown keywords are silently ignored (the real one pops known
  keys and never looks at the rest).
- InferenceConfig(neuron_config, fused_spec_config=None, load_config=None, metadata=None,
  **kwargs): runs load_config(self) (utils.hf_adapter.load_pretrained_config(path) returns
  one), sets kwargs, add_derived_config(), then validate_config(), which asserts
  "Config must define [...]" for the model's required attributes. save(dir) writes
  dir/neuron_config.json as json.dumps(to_dict(self), indent=2, sort_keys=True); load(dir)
  reads it back (FileNotFoundError when missing) and rebuilds the NeuronConfig from its
  dict, which logs the derived attributes it does not take as keywords as "unexpected"
  (as the real one does on every reload).
- Speculation (243-256): speculation_length 0, spec_batch_size batch_size, enable_fused_speculation,
  enable_eagle_speculation (True turns enable_fused_speculation on, 255-256), is_eagle3, is_eagle_draft,
  enable_eagle_draft_input_norm; batch bucketing beside any speculation raises ValueError (610-654).
  `trace_tokengen_model` is no keyword (a keyword of that name is logged as unexpected): reading the
  attribute warns DeprecationWarning and derives it (730-740, the real expression kept: it is True
  unless Medusa is on as well).
- FusedSpecNeuronConfig(worker_cls, draft_config=None, draft_model_path=None, draft_model_cls=None)
  (1004-1020) only holds them; to_dict writes worker_cls as {"__module__", "__name__"}. Reading
  neuron_config.json back (from_json_string, 951-995) rebuilds it: the draft's NeuronConfig and config
  (with the config class itself when no draft_model_cls is recorded), and worker_cls imported from
  its module (ModuleNotFoundError "Failed to load class ..." when that fails).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import os
import warnings
from typing import Any, ClassVar

import torch
from torch_neuronx.utils import get_platform_target

from neuronx_distributed_inference.modules.lora_serving import LoraServingConfig

CONFIG_FILE = "neuron_config.json"
LONG_CONTEXT_SCRATCHPAD_PAGE_SIZE = 1024

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
}


def to_torch_dtype(dtype_str: str) -> torch.dtype:
    assert dtype_str in _DTYPES, f"Unsupported dtype: {dtype_str}"
    return _DTYPES[dtype_str]


def to_dict(obj: Any) -> Any:
    """What neuron_config.json holds: dicts and lists recursively, a class as its module and
    name, an object as its __dict__, a torch.dtype as its name ("bfloat16")."""
    if type(obj) is dict:
        return {key: to_dict(value) for key, value in obj.items()}
    if type(obj) is list:
        return [to_dict(value) for value in obj]
    if inspect.isclass(obj):
        return {"__module__": obj.__module__, "__name__": obj.__name__}
    if hasattr(obj, "__dict__"):
        return {key: to_dict(value) for key, value in obj.__dict__.items()}
    if type(obj) is torch.dtype:
        return str(obj).split(".")[1]
    return obj


class IncompatibleConfigError(ValueError):
    pass


def get_platform_lnc() -> int:
    warnings.warn(
        "neuronx_distributed_inference.models.config.get_platform_lnc() is deprecated. "
        "Use neuronx_distributed.utils.model_utils.get_platform_lnc() instead.",
        category=DeprecationWarning,
        stacklevel=2,
    )
    return 2 if get_platform_target() in ("trn2", "trn3") else 1


class OnDeviceSamplingConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.do_sample = kwargs.pop("do_sample", False)
        self.top_k = kwargs.pop("top_k", 1)
        self.top_p = kwargs.pop("top_p", 1.0)
        self.temperature = kwargs.pop("temperature", 1.0)
        self.dynamic = kwargs.pop("dynamic", False)
        self.deterministic = kwargs.pop("deterministic", False)
        self.global_topk = kwargs.pop("global_topk", 256)
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", True)
        self.top_k_kernel_enabled = kwargs.pop("top_k_kernel_enabled", False)
        self.sampling_dp_degree = kwargs.pop("sampling_dp_degree", 1)


class ChunkedPrefillConfig:
    def __init__(self, **kwargs: Any) -> None:
        self.max_num_seqs = kwargs.pop("max_num_seqs", 0)
        self.tkg_model_enabled = kwargs.pop("tkg_model_enabled", True)
        self.kernel_q_tile_size = kwargs.pop("kernel_q_tile_size", 128)
        self.kernel_kv_tile_size = kwargs.pop("kernel_kv_tile_size", 1024)


class NeuronConfig:
    """Base config class for inference in NxD (see the module docstring)."""

    def __init__(self, **kwargs: Any) -> None:
        # Basic config
        self.batch_size = kwargs.pop("batch_size", 1)
        self.padding_side = kwargs.pop("padding_side", "right")
        self.allow_input_truncation = kwargs.pop("allow_input_truncation", False)
        self.seq_len = kwargs.pop("seq_len", 128)
        self.n_active_tokens = kwargs.pop("n_active_tokens", self.seq_len)
        self.n_positions = kwargs.pop("n_positions", self.seq_len)
        self.on_cpu = kwargs.pop("on_cpu", False)
        self.output_logits = kwargs.pop("output_logits", False)
        self.is_prefill_stage = None

        if "torch_dtype" in kwargs:
            self.torch_dtype = kwargs.pop("torch_dtype")
            if isinstance(self.torch_dtype, str):
                self.torch_dtype = to_torch_dtype(self.torch_dtype)
            self.overrides_torch_dtype = kwargs.pop("overrides_torch_dtype", True)
        else:
            self.torch_dtype = torch.bfloat16
            self.overrides_torch_dtype = False

        self.cast_type = kwargs.pop("cast_type", "config")
        if self.cast_type not in ["config", "as-declared"]:
            raise ValueError("cast_type must be one of config, as-declared")
        self.rpl_reduce_dtype = kwargs.pop("rpl_reduce_dtype", None)
        if isinstance(self.rpl_reduce_dtype, str):
            self.rpl_reduce_dtype = to_torch_dtype(self.rpl_reduce_dtype)
        self.attention_dtype = kwargs.pop("attention_dtype", None)
        if isinstance(self.attention_dtype, str):
            self.attention_dtype = to_torch_dtype(self.attention_dtype)
        if self.attention_dtype is not None and self.attention_dtype != self.torch_dtype:
            assert self.cast_type == "as-declared", (
                "attention dtype and torch dtype are different, however global cast is enabled. To enable running "
                "multiple precisions, set cast-type to 'as-declared'"
            )

        self.max_context_length = kwargs.pop("max_context_length", self.seq_len)
        self.max_new_tokens = kwargs.pop("max_new_tokens", self.seq_len - self.max_context_length)
        if self.max_new_tokens == 0:
            self.max_new_tokens = None
        self.max_length = kwargs.pop("max_length", self.seq_len)
        assert self.max_context_length <= self.max_length, "max_context_length cannot be more than max_length"

        self.vocab_parallel = kwargs.pop("vocab_parallel", False)
        self.enable_cte_modular_flow = kwargs.pop("enable_cte_modular_flow", False)
        self.layer_boundary_markers = kwargs.pop("layer_boundary_markers", False)

        # Attention
        self.fused_qkv = kwargs.pop("fused_qkv", False)
        self.sequence_parallel_enabled = kwargs.pop("sequence_parallel_enabled", False)
        self.weight_gather_seq_len_threshold = kwargs.pop("weight_gather_seq_len_threshold", 32768)
        self.attn_cls = kwargs.pop("attn_cls", "NeuronLlamaAttention")

        # Continuous batching
        self.ctx_batch_size = kwargs.pop("ctx_batch_size", self.batch_size)
        self.tkg_batch_size = kwargs.pop("tkg_batch_size", self.batch_size)
        self.max_batch_size = kwargs.pop("max_batch_size", self.batch_size)
        self.is_continuous_batching = kwargs.pop("is_continuous_batching", False)

        # KV cache
        self.kv_cache_batch_size = kwargs.pop("kv_cache_batch_size", self.batch_size)
        self.kv_cache_padding_size = kwargs.pop("kv_cache_padding_size", 0)

        # On-device sampling
        self.on_device_sampling_config = kwargs.pop("on_device_sampling_config", None)
        if type(self.on_device_sampling_config) is dict:
            self.on_device_sampling_config = OnDeviceSamplingConfig(**self.on_device_sampling_config)
        self.disable_argmax_kernel = kwargs.pop("disable_argmax_kernel", False)

        self.async_mode = kwargs.pop("async_mode", False)

        # Bucketing
        self.enable_bucketing = kwargs.pop("enable_bucketing", False)
        self.buckets = kwargs.pop("buckets", [self.seq_len])
        self.bucket_n_active_tokens = kwargs.pop("bucket_n_active_tokens", False)
        self.context_encoding_buckets = kwargs.pop("context_encoding_buckets", None)
        self.prefix_buckets = kwargs.pop("prefix_buckets", None)
        self.token_generation_buckets = kwargs.pop("token_generation_buckets", None)
        if self.context_encoding_buckets is not None:
            self.context_encoding_buckets.sort()  # in place, as the real one: the caller's list is sorted too
            assert self.context_encoding_buckets[-1] <= self.max_context_length, (
                f"Context bucket {self.context_encoding_buckets[-1]} should be <= {self.max_context_length}"
            )
        if self.token_generation_buckets is not None:
            self.token_generation_buckets.sort()
            assert self.token_generation_buckets[-1] <= self.max_length, (
                f"Token generation bucket {self.token_generation_buckets[-1]} should be <= {self.max_length}"
            )
        self.token_generation_batches = kwargs.pop("token_generation_batches", None)
        if self.token_generation_batches is not None:
            if not isinstance(self.token_generation_batches, list):
                self.token_generation_batches = [self.token_generation_batches]
            self.token_generation_batches.sort()
            assert self.token_generation_batches[-1] <= self.tkg_batch_size, (
                f"Token generation batch buckets {self.token_generation_batches} "
                f"should be <= token generation batch size ({self.tkg_batch_size})"
            )

        # Quantization
        self.quantized = kwargs.pop("quantized", False)
        self.quantized_checkpoints_path = kwargs.pop("quantized_checkpoints_path", None)
        if self.quantized is True:
            assert self.quantized_checkpoints_path is not None, "quantized_checkpoints_path is required"
        self.quantization_type = kwargs.pop("quantization_type", "per_tensor_symmetric")
        self.quantization_dtype = kwargs.pop("quantization_dtype", "int8")
        self.quantization_block_size = kwargs.pop("quantization_block_size", None)
        self.quantization_block_axis = kwargs.pop("quantization_block_axis", None)
        self.quantization_scale_dtype = kwargs.pop("quantization_scale_dtype", "f32")
        self.is_mxfp4_compute = kwargs.pop("is_mxfp4_compute", False)
        self.is_hidden_dim_shuffled = self.is_mxfp4_compute
        self.is_intermediate_dim_shuffled = self.is_mxfp4_compute
        self.is_full_model_shuffled = kwargs.pop("is_full_model_shuffled", False)
        self.modules_to_not_convert = kwargs.pop("modules_to_not_convert", None)
        self.draft_model_modules_to_not_convert = kwargs.pop("draft_model_modules_to_not_convert", None)
        self.kv_cache_quant = kwargs.pop("kv_cache_quant", False)

        # Speculative decoding
        self.speculation_length = kwargs.pop("speculation_length", 0)
        self.spec_batch_size = kwargs.pop("spec_batch_size", self.batch_size)
        self.enable_fused_speculation = kwargs.pop("enable_fused_speculation", False)
        self.enable_eagle_speculation = kwargs.pop("enable_eagle_speculation", False)
        self.eagle_rolling_buffer_kernel_enabled = kwargs.pop("eagle_rolling_buffer_kernel_enabled", False)
        self.is_eagle3 = kwargs.pop("is_eagle3", False)
        self.is_eagle_draft = kwargs.pop("is_eagle_draft", False)
        self.enable_eagle_draft_input_norm = kwargs.pop("enable_eagle_draft_input_norm", False)
        assert not self.is_full_model_shuffled or (self.is_mxfp4_compute or self.is_eagle_draft), (
            "is_full_model_shuffled only works with is_mxfp4_compute in target model or an eagle draft model."
        )
        if self.enable_eagle_speculation:
            self.enable_fused_speculation = True
        if self.speculation_length > 0 and self.async_mode and not self.enable_fused_speculation:
            warnings.warn(
                "Unfused Speculative Decoding + async mode may not result in performance improvements due to high "
                "likelihood of data dependent compute causing blocking calls.",
                stacklevel=2,
            )
        self.token_tree_config = kwargs.pop("token_tree_config", None)
        self.enable_token_tree = self.token_tree_config is not None

        # Medusa
        self.is_medusa = kwargs.pop("is_medusa", False)
        self.medusa_speculation_length = kwargs.pop("medusa_speculation_length", 0)
        self.num_medusa_heads = kwargs.pop("num_medusa_heads", 0)
        self.medusa_tree = kwargs.pop("medusa_tree", None)
        if self.is_medusa and self.async_mode:
            raise IncompatibleConfigError("Medusa Decoding is not yet supported with async.")

        # Paged attention, prefix caching, windowed context encoding, chunked prefill
        self.is_block_kv_layout = kwargs.pop("is_block_kv_layout", False)
        self.pa_num_blocks = kwargs.pop("pa_num_blocks", self.batch_size)
        self.pa_block_size = kwargs.pop("pa_block_size", self.seq_len)
        self.is_prefix_caching = kwargs.pop("is_prefix_caching", False)
        self.windowed_context_encoding_size = kwargs.pop("windowed_context_encoding_size", None)
        self.chunked_prefill_config = kwargs.pop("chunked_prefill_config", None)
        if type(self.chunked_prefill_config) is dict:
            self.chunked_prefill_config = ChunkedPrefillConfig(**self.chunked_prefill_config)
        self.kv_quant_config = kwargs.pop("kv_quant_config", None)
        self.is_chunked_prefill = self.chunked_prefill_config is not None
        if self.is_chunked_prefill:
            assert self.is_block_kv_layout, (
                "is_block_kv_layout has to be true for chunked prefill because it depends on block KV"
            )
            if not self.chunked_prefill_config.tkg_model_enabled:
                assert self.batch_size == 1, (
                    "batch_size has to be 1 for chunked prefill CTE model because it concatenates all requests into "
                    "one long request"
                )

        # Debugging aids (the fake keeps what it was given)
        self.tensor_replacement_config = kwargs.pop("tensor_replacement_config", None)
        self.tensor_capture_config = kwargs.pop("tensor_capture_config", None)
        if self.tensor_capture_config and not self.output_logits:
            self.output_logits = True
            if self.on_device_sampling_config is None:
                raise IncompatibleConfigError(
                    "Tensor capture requires on device sampling config to be set even if it's just defaults"
                )

        # Lora (config.py:355-358): a dict is turned into a LoraServingConfig, which re-reads and
        # re-checks the adapter paths (what a reload of neuron_config.json does too)
        self.lora_config = kwargs.pop("lora_config", None)
        if type(self.lora_config) is dict:
            self.lora_config = LoraServingConfig(**self.lora_config)

        # Distributed config
        self.tp_degree = kwargs.pop("tp_degree", 1)
        self.cp_degree = kwargs.pop("cp_degree", 1)
        self.mlp_cp_degree = kwargs.pop("mlp_cp_degree", 1)
        self.attention_dp_degree = kwargs.pop("attention_dp_degree", 1)
        self.pp_degree = kwargs.pop("pp_degree", 1)
        self.ep_degree = kwargs.pop("ep_degree", 1)
        self.save_sharded_checkpoint = kwargs.pop("save_sharded_checkpoint", False)
        self.skip_sharding = kwargs.pop("skip_sharding", False)
        if self.tp_degree % self.cp_degree != 0:
            raise ValueError("TP Degree must be evenly divisible by CP Degree")
        if self.mlp_cp_degree > 1 and not self.sequence_parallel_enabled:
            raise IncompatibleConfigError("Context Parallel for MLP requires Sequence Parallel to be enabled")
        self.qk_layernorm = kwargs.pop("qk_layernorm", False)
        self.pre_rope_rmsnorm = kwargs.pop("pre_rope_rmsnorm", False)
        self.world_size = kwargs.pop("world_size", None)
        if self.world_size is None:
            self.world_size = self.tp_degree * self.pp_degree * self.ep_degree
        self.start_rank_id = kwargs.pop("start_rank_id", 0)
        self.local_ranks_size = kwargs.pop("local_ranks_size", None)
        if self.local_ranks_size is None:
            self.local_ranks_size = self.world_size

        self.flash_decoding_enabled = kwargs.pop("flash_decoding_enabled", False)
        self.disable_kv_cache_tiling = kwargs.pop("disable_kv_cache_tiling", False)
        self.kv_cache_tiling = False
        if not self.disable_kv_cache_tiling and (self.enable_eagle_speculation or self.enable_fused_speculation):
            self.kv_cache_tiling = self.max_length > 128 and self.max_length % 128 == 0
        self.k_cache_transposed = kwargs.pop("k_cache_transposed", False)

        # Kernels
        self.attn_kernel_enabled = kwargs.pop("attn_kernel_enabled", None)
        self.strided_context_parallel_kernel_enabled = kwargs.pop("strided_context_parallel_kernel_enabled", False)
        self.qkv_kernel_enabled = kwargs.pop("qkv_kernel_enabled", False)
        self.qkv_nki_kernel_enabled = kwargs.pop("qkv_nki_kernel_enabled", False)
        self.qkv_cte_nki_kernel_fuse_rope = kwargs.pop("qkv_cte_nki_kernel_fuse_rope", False)
        if self.qkv_cte_nki_kernel_fuse_rope:
            assert self.qkv_kernel_enabled and self.qkv_nki_kernel_enabled, (
                "When qkv_cte_nki_kernel_fuse_rope is set to True, qkv_kernel_enabled (currently: "
                f"{self.qkv_kernel_enabled}) and qkv_nki_kernel_enabled (currently: {self.qkv_nki_kernel_enabled}) "
                "must also be set to True."
            )
        self.qkv_kernel_nbsd_layout = kwargs.pop("qkv_kernel_nbsd_layout", False)
        self.mlp_kernel_enabled = kwargs.pop("mlp_kernel_enabled", False)
        self.mlp_tkg_nki_kernel_enabled = kwargs.pop("mlp_tkg_nki_kernel_enabled", False)
        self.fused_rmsnorm_skip_gamma = kwargs.pop("fused_rmsnorm_skip_gamma", False)
        self.mlp_kernel_fuse_residual_add = kwargs.pop("mlp_kernel_fuse_residual_add", False)
        self.qkv_kernel_fuse_residual_add = kwargs.pop("qkv_kernel_fuse_residual_add", False)
        self.quantized_mlp_kernel_enabled = kwargs.pop("quantized_mlp_kernel_enabled", False)
        self.out_proj_kernel_enabled = kwargs.pop("out_proj_kernel_enabled", False)
        self.activation_quantization_type = kwargs.pop("activation_quantization_type", None)
        if self.activation_quantization_type is not None:
            self.fused_qkv = kwargs.pop("fused_qkv", False)
            if self.activation_quantization_type == "STATIC" and self.fused_qkv:
                raise IncompatibleConfigError("Static quantization is not supported for fused qkv")
        if self.strided_context_parallel_kernel_enabled and not self.cp_degree > 1:
            raise ValueError("CP must also be enabled when strided_context_parallel_kernel_enabled is set.")
        self.attn_tkg_nki_kernel_enabled = kwargs.pop("attn_tkg_nki_kernel_enabled", False)
        self.attn_tkg_builtin_kernel_enabled = kwargs.pop("attn_tkg_builtin_kernel_enabled", False)
        self.attn_block_tkg_nki_kernel_enabled = kwargs.pop("attn_block_tkg_nki_kernel_enabled", False)
        self.attn_block_cte_nki_kernel_enabled = kwargs.pop("attn_block_cte_nki_kernel_enabled", False)
        if self.attn_block_tkg_nki_kernel_enabled:
            assert self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled, (
                "When attn-block-tkg-nki-kernel-enabled, self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled is "
                "also required."
            )
        if self.attn_block_cte_nki_kernel_enabled:
            assert self.attn_block_tkg_nki_kernel_enabled and (
                self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled
            ), (
                "When attn-block-cte-nki-kernel-enabled, attn-block-tkg-nki-kernel-enabled and (qkv_kernel_enabled or "
                "qkv_nki_kernel_enabled) are also required."
            )
        tkg_kernels = [
            self.attn_tkg_nki_kernel_enabled,
            self.attn_tkg_builtin_kernel_enabled,
            self.attn_block_tkg_nki_kernel_enabled,
        ]
        assert sum(tkg_kernels) <= 1, (
            "Multiple token-generation attention kernels enabled. Please enable no more than one of: "
            "[attn-tkg-nki-kernel-enabled, attn-tkg-builtin-kernel-enabled, attn-block-tkg-nki-kernel-enabled]"
        )
        self.attn_block_tkg_nki_kernel_cache_update = kwargs.pop("attn_block_tkg_nki_kernel_cache_update", False)
        self.attn_block_tkg_nki_kernel_cascaded_attention = kwargs.pop(
            "attn_block_tkg_nki_kernel_cascaded_attention", False
        )
        if not self.attn_block_tkg_nki_kernel_enabled:
            assert not self.attn_block_tkg_nki_kernel_cache_update, (
                "attn-block-tkg-nki-kernel-cache-update can only be enabled with attn-block-tkg-nki-kernel-enabled"
            )
            assert not self.attn_block_tkg_nki_kernel_cascaded_attention, (
                "attn_block_tkg_nki_kernel_cascaded_attention can only be enabled with "
                "attn-block-tkg-nki-kernel-enabled"
            )
        self.attn_block_tkg_nki_kernel_use_online_softmax = kwargs.pop(
            "attn_block_tkg_nki_kernel_use_online_softmax", True
        )
        self.attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb = kwargs.pop(
            "attn_block_tkg_nki_kernel_disable_gpsimd_sb2sb", False
        )
        self.kv_cache_update_with_kernel = False
        if self.attention_dp_degree > 1:
            self.kv_cache_batch_size = self.tkg_batch_size // self.attention_dp_degree
            self.kv_cache_padding_size = 1
        if self.attn_block_tkg_nki_kernel_cache_update:
            self.kv_cache_tiling = False
        if sum(tkg_kernels) > 0:
            assert not self.flash_decoding_enabled, "Attention TKG kernels do not yet support flash decoding feature."
            assert not self.is_chunked_prefill, "Attention TKG kernels do not yet support contexted prefill feature."
        if self.k_cache_transposed:
            for flag, feature in [
                (self.flash_decoding_enabled, "flash decoding"),
                (self.is_chunked_prefill, "contexted prefill"),
                (self.is_block_kv_layout, "block KV cache"),
            ]:
                assert not flag, f"Transposed K cache is not yet supported by {feature} feature."
        if self.quantized_mlp_kernel_enabled or self.mlp_kernel_enabled:
            assert not self.activation_quantization_type, "native quantization does not work with quantized kernels"
        self.rmsnorm_quantize_kernel_enabled = kwargs.pop("rmsnorm_quantize_kernel_enabled", False)
        if self.rmsnorm_quantize_kernel_enabled:
            assert self.quantized_mlp_kernel_enabled, (
                "quantized_mlp_kernel must be enabled to use rmsnorm_quantize_kernel!"
            )
        self.quantize_clamp_bound = kwargs.pop("quantize_clamp_bound", float("inf"))
        if (self.quantized or self.is_mlp_quantized()) and not (self.qkv_kernel_enabled or self.qkv_nki_kernel_enabled):
            if not self.modules_to_not_convert:
                warnings.warn(
                    "modules_to_not_convert is not provided. Assuming all modules will be quantized.",
                    UserWarning,
                    stacklevel=2,
                )
        elif self.quantized or self.is_mlp_quantized():
            assert self.modules_to_not_convert, "Could not find modules_to_not_convert for quantized model."
        self.moe_fused_nki_kernel_enabled = kwargs.pop("moe_fused_nki_kernel_enabled", None)
        self.router_topk_nki_kernel_enabled = kwargs.pop("router_topk_nki_kernel_enabled", None)
        self.expert_mlp_nki_kernel_enabled = kwargs.pop("expert_mlp_nki_kernel_enabled", None)
        self.shared_mlp_nki_kernel_enabled = kwargs.pop("shared_mlp_nki_kernel_enabled", None)

        # Logical NeuronCore config
        self.logical_nc_config = self._get_lnc(kwargs)
        self.lm_head_pad = kwargs.pop("lm_head_pad", self.logical_nc_config > 1)
        self.lm_head_pad_alignment_size = kwargs.pop("lm_head_pad_alignment_size", 1)
        if self.is_mlp_quantized():
            self.quantization_type = "per_channel_symmetric"
            self.quantization_dtype = "f8e4m3"

        # Compiler flags
        self.cc_pipeline_tiling_factor = kwargs.pop("cc_pipeline_tiling_factor", 2)
        self.seq_len_threshold_for_cc_tiling = kwargs.pop("seq_len_threshold_for_cc_tiling", 16384)
        self.tile_cc = self.cc_pipeline_tiling_factor > 1 and (
            self.mlp_kernel_enabled or self.quantized_mlp_kernel_enabled
        )
        self.target = kwargs.pop("target", None)
        self.enable_spill_reload_dge = kwargs.pop("enable_spill_reload_dge", False)
        self.weights_to_skip_layout_optimization = kwargs.pop("weights_to_skip_layout_optimization", [])
        if self.lora_config and self.lora_config.dynamic_multi_lora:  # config.py:562-564
            self.weights_to_skip_layout_optimization.append(r".*lora.*")
        self.dma_order_config = kwargs.pop("dma_order_config", None)
        if self.quantized:
            assert self.quantized_checkpoints_path is not None, "quantized_checkpoints_path is required"

        self.apply_seq_ids_mask = kwargs.pop("apply_seq_ids_mask", False)
        self.skip_warmup = kwargs.pop("skip_warmup", False)

        self.scratchpad_page_size = None
        self.enable_long_context_mode = self.max_context_length >= 32 * 1024
        if self.enable_long_context_mode:
            self.scratchpad_page_size = LONG_CONTEXT_SCRATCHPAD_PAGE_SIZE
        self.scratchpad_page_size = kwargs.pop("scratchpad_page_size", self.scratchpad_page_size)
        if self.scratchpad_page_size:
            self.scratchpad_page_size = int(self.scratchpad_page_size)
        self.enable_output_completion_notifications = kwargs.pop("enable_output_completion_notifications", False)
        self.padded_hidden_size = kwargs.pop("padded_hidden_size", None)
        self.padded_intermediate_size = kwargs.pop("padded_intermediate_size", None)
        self.disable_numeric_cc_token = kwargs.pop("disable_numeric_cc_token", False)
        self.switch_cc = kwargs.pop("switch_cc", False)
        self.ep_dispatch_cc_option = kwargs.pop("ep_dispatch_cc_option", "AR_AG")

        if kwargs:
            logging.warning(f"NeuronConfig init: Unexpected keyword arguments: {kwargs}")

        self.validate_attention_data_parallel(self.attention_dp_degree)
        self._validate_batch_bucketing_compatibility()

    def _validate_batch_bucketing_compatibility(self) -> None:
        if self.token_generation_batches is None:
            return
        incompatible = []
        if self.speculation_length > 0:
            incompatible.append(f"speculative decoding ({self.speculation_length=})")
        if self.enable_fused_speculation:
            incompatible.append("fused speculation (enable_fused_speculation=True)")
        if self.enable_eagle_speculation:
            incompatible.append("EAGLE speculation (enable_eagle_speculation=True)")
        if self.is_medusa:
            incompatible.append("Medusa decoding (is_medusa=True)")
        if self.enable_token_tree:
            incompatible.append("token tree (enable_token_tree=True)")
        if self.is_chunked_prefill:
            incompatible.append("chunked prefill (is_chunked_prefill=True)")
        if self.is_prefix_caching:
            incompatible.append("prefix caching (is_prefix_caching=True)")
        if self.is_block_kv_layout:
            incompatible.append("block KV layout (is_block_kv_layout=True)")
        if incompatible:
            raise ValueError(
                f"Batch bucketing (token_generation_batches={self.token_generation_batches}) "
                f"is not currently supported with the following features: {', '.join(incompatible)}. "
                "Please disable batch bucketing or the incompatible features."
            )

    def validate_attention_data_parallel(self, attention_dp_degree: int) -> None:
        if self.tp_degree % attention_dp_degree != 0:
            raise ValueError("TP Degree must be evenly divisible by DP Degree")
        if self.tkg_batch_size % attention_dp_degree != 0:
            raise ValueError("Batch Size must be evenly divisible by DP Degree")
        if self.cp_degree > 1 and attention_dp_degree > 1 and self.cp_degree < attention_dp_degree:
            raise ValueError("Running DP Degree > CP Degree is not supported when CP and DP is enabled")
        if self.cp_degree > 1 and attention_dp_degree > 1 and self.cp_degree % attention_dp_degree != 0:
            raise ValueError("CP Degree % DP Degree should be 0 when CP and DP is enabled")
        if attention_dp_degree > 1 and not self.is_continuous_batching:
            raise ValueError("--is-continuous-batching must be enabled when running DP")
        if self.ep_dispatch_cc_option == "RS_AG" and self.tp_degree > self.tkg_batch_size:
            raise ValueError("EP Dispatch option RS_AG not supported when TP degree > batch size")

    def _get_lnc(self, kwargs: dict[str, Any]) -> int:
        env_lnc = int(os.environ.get("NEURON_LOGICAL_NC_CONFIG", -1))
        kwargs_lnc = -1
        platform_lnc = get_platform_lnc()
        if "logical_neuron_cores" in kwargs:
            warnings.warn(
                "'logical_neuron_cores' is deprecated and replaced by 'logical_nc_config'. "
                "In a future release, this attribute will be removed.",
                category=DeprecationWarning,
                stacklevel=3,
            )
            kwargs_lnc = int(kwargs.pop("logical_neuron_cores"))
        if "logical_nc_config" in kwargs:
            kwargs_lnc = int(kwargs.pop("logical_nc_config"))
        if env_lnc != -1 and kwargs_lnc != -1 and env_lnc != kwargs_lnc:
            warnings.warn(
                f"NEURON_LOGICAL_NC_CONFIG={env_lnc} does not match provided logical_nc_config={kwargs_lnc}. "
                "Using NEURON_LOGICAL_NC_CONFIG to set LNC.",
                category=UserWarning,
                stacklevel=3,
            )
        if env_lnc != -1:
            return env_lnc
        if kwargs_lnc != -1:
            return kwargs_lnc
        return platform_lnc

    def __getattribute__(self, name: str) -> Any:
        if name == "trace_tokengen_model":  # config.py:730-740: derived, deprecated
            warnings.warn(
                "'trace_tokengen_model' is deprecated and will be removed in a future release. "
                "Returning the expected value based on current configuration",
                category=DeprecationWarning,
                stacklevel=2,
            )
            return (
                not self.enable_fused_speculation
                or not self.speculation_length > 0
                or not self.medusa_speculation_length > 0
            )
        return super().__getattribute__(name)

    def is_mlp_quantized(self) -> Any:
        return self.quantized_mlp_kernel_enabled or self.activation_quantization_type


class InferenceConfig:
    attribute_map: ClassVar[dict[str, str]] = {}

    def __init__(
        self,
        neuron_config: NeuronConfig,
        fused_spec_config: Any = None,
        load_config: Any = None,
        metadata: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.neuron_config = neuron_config
        self.fused_spec_config = fused_spec_config
        if load_config is not None:
            load_config(self)
        else:
            self.load_config()
        self.metadata = metadata
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.add_derived_config()
        self.validate_config()

    def __setattr__(self, key: str, value: Any) -> None:
        attribute_map = super().__getattribute__("attribute_map")
        super().__setattr__(attribute_map.get(key, key), value)

    def __getattribute__(self, key: str) -> Any:
        if key != "attribute_map":
            attribute_map = super().__getattribute__("attribute_map")
            key = attribute_map.get(key, key)
        return super().__getattribute__(key)

    def add_derived_config(self) -> None:
        self.num_cores_per_group = 1

    def load_config(self) -> None:
        pass

    def get_required_attributes(self) -> list[str]:
        return []

    def validate_config(self) -> None:
        missing = [name for name in self.get_required_attributes() if not hasattr(self, name)]
        assert len(missing) == 0, f"Config must define {missing}"
        wce_size = self.neuron_config.windowed_context_encoding_size
        sliding_window = getattr(self, "sliding_window", None)
        if wce_size is not None and sliding_window is not None:
            assert wce_size == sliding_window, (
                "Windowed context encoding size must equal sliding window size, if using both. Got "
                f"windowed_context_encoding_size = {wce_size}, sliding_window = {sliding_window}"
            )

    def save(self, model_path: str | os.PathLike[str]) -> None:
        if not os.path.exists(model_path):
            os.makedirs(model_path)
        self.to_json_file(os.path.join(model_path, CONFIG_FILE))

    def to_json_file(self, json_file: str | os.PathLike[str]) -> None:
        with open(json_file, "w", encoding="utf-8") as writer:
            writer.write(self.to_json_string() + "\n")

    def to_json_string(self) -> str:
        return json.dumps(to_dict(self), indent=2, sort_keys=True)

    def get_text_config(self) -> InferenceConfig:
        text_config = getattr(self, "text_config", None)
        return text_config if text_config is not None else self

    @classmethod
    def load(cls, model_path: str | os.PathLike[str], **kwargs: Any) -> InferenceConfig:
        return cls.from_json_file(os.path.join(model_path, CONFIG_FILE), **kwargs)

    @classmethod
    def from_json_file(cls, json_file: str | os.PathLike[str], **kwargs: Any) -> InferenceConfig:
        with open(json_file, encoding="utf-8") as reader:
            return cls.from_json_string(reader.read(), **kwargs)

    @classmethod
    def from_json_string(cls, json_string: str, **kwargs: Any) -> InferenceConfig:
        merged = json.loads(json_string)
        merged.update(kwargs)
        if isinstance(merged.get("neuron_config"), dict):
            merged["neuron_config"] = cls.get_neuron_config_cls()(**merged["neuron_config"])
        if isinstance(merged.get("fused_spec_config"), dict):  # config.py:951-995
            merged["fused_spec_config"] = cls._fused_spec_from_dict(merged["fused_spec_config"])
        return cls(**merged)

    @staticmethod
    def get_draft_neuron_class(fused_spec_config_dict: dict[str, Any]) -> Any:
        """config.py:915-922."""
        recorded = fused_spec_config_dict.get("draft_model_cls")
        if recorded:
            return getattr(importlib.import_module(recorded["__module__"]), recorded["__name__"])
        return None

    @classmethod
    def _fused_spec_from_dict(cls, data: dict[str, Any]) -> FusedSpecNeuronConfig:
        draft_class = cls.get_draft_neuron_class(data)
        draft = data.get("draft_config")
        if isinstance(draft, dict):
            if isinstance(draft.get("neuron_config"), dict):
                neuron_config_cls = (
                    draft_class.get_config_cls().get_neuron_config_cls()
                    if draft_class is not None
                    else cls.get_neuron_config_cls()
                )
                draft["neuron_config"] = neuron_config_cls(**draft["neuron_config"])
            data["draft_config"] = (draft_class.get_config_cls() if draft_class is not None else cls)(**draft)
        fused = FusedSpecNeuronConfig(**data)
        fused.draft_model_cls = draft_class
        name, module = fused.worker_cls["__name__"], fused.worker_cls["__module__"]
        try:
            fused.worker_cls = getattr(importlib.import_module(module), name)
        except Exception as error:
            raise ModuleNotFoundError(
                f"Failed to load class {name} from module {module}. Make sure the module exists in NxDI and model "
                "class is supported. If the compiled model is from NxDI v0.2 or earlier, try recompiling the model."
            ) from error
        return fused

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return NeuronConfig


class FusedSpecNeuronConfig:
    """config.py:1004-1020: what the fused speculation model is built from (the target's model class, the
    draft's InferenceConfig and checkpoint)."""

    def __init__(
        self,
        worker_cls: Any,
        draft_config: InferenceConfig | None = None,
        draft_model_path: str | None = None,
        draft_model_cls: Any = None,
    ) -> None:
        self.worker_cls = worker_cls
        self.draft_model_cls = draft_model_cls
        self.draft_config = draft_config
        self.draft_model_path = draft_model_path
