"""Mirrors ModelWrapper of src/neuronx_distributed_inference/models/model_wrapper.py (NxDI
0.8.16251, SDK 2.28 commit cd3abf3): what happens on the host between
NeuronBaseForCausalLM.forward and the compiled program, for the paths a continuous-batching
server takes (no async, no prefix caching, no batch bucketing; of speculation, fused EAGLE only).

Per call, in the real order (`forward`):
1. `_process_args`: a dummy `prev_hidden` and `adapter_ids` (zeros, one per row) are added,
   then int64 tensors become int32.
2. `pad_inputs` picks the bucket from the **attention mask's width** (`get_target_bucket`,
   `_get_seq_bucket`, strategy "first_fit"): the first bucket strictly greater than it; a
   width equal to the largest bucket is allowed; a longer one raises
   ValueError("Input len X exceeds largest bucket (Y) for <tag>"). Context encoding pads
   input_ids with the checkpoint's pad_token_id (0 when it has none), the mask with 0 and
   position_ids with **1**; token generation pads only the mask, with 0.
3. With exactly `batch_size` rows (ctx_batch_size for context encoding, tkg_batch_size for
   token generation) the program runs on the rows as given: **seq_ids are not used to
   place rows** (row i is KV line i in token generation).
4. With more rows, they run `batch_size` at a time (`vllm_cte_repadding` re-buckets each
   slice from its own max(position_ids) + 1), the last slice padded as in 5.
5. With fewer rows (`_forward_with_pad`): the missing seq_ids in range(max_batch_size) are
   appended, the list is sorted, every other input is padded by repeating the **first** row
   and reordered the same way; with apply_seq_ids_mask the appended seq_ids become -1. The
   output rows are then picked with index_select(out, 0, seq_ids): the caller's order.

Fused speculation (tag FUSED_SPECULATION_MODEL_TAG): the bucket needs room for the speculation_length
positions a call writes: the first bucket strictly above the mask's width + speculation_length, or the
largest when equal (get_target_bucket 826-841, _get_seq_bucket 898-916); the outputs are a list (the
accepted tokens, the next input ids, the next attention mask, the next positions), each row-selected
back into the caller's order (691-694) and each concatenated over slices (1432-1435). Tracing a fused
model checks what its forwards assert: on-device sampling on the target (`assert
self.neuron_config.on_device_sampling_config`, model_base.py:1869, 2081, 2576) and a draft config with
one (NeuronFusedSpecModel.__init__ sets its do_sample, 1676-1678: AttributeError on None).

Tracing a LoRA model's token generation (lora_config set) fails when LoraServingConfig.batch_size is
neither 1 nor the batch (the einsum of lora_layer.py:68-71, RuntimeError as torch raises it).

The compiled program itself (shape routing, KV cache, attention, sampling, LoRA) is the fake's
device, models/_device.py.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F

CONTEXT_ENCODING_MODEL_TAG = "context_encoding_model"
TOKEN_GENERATION_MODEL_TAG = "token_generation_model"
FUSED_SPECULATION_MODEL_TAG = "fused_speculation_model"


class _TraceableInstance:
    """Stands in for DecoderModelInstance: what ModelBuilder traces for one tag. Tracing runs
    the model on each bucket's example inputs; the fake runs the real trace-time assertions."""

    def __init__(self, wrapper: ModelWrapper) -> None:
        self.wrapper = wrapper

    def load_module(self) -> None:
        pass

    def get(self, bucket_rank: int, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return self._trace, {}

    def _trace(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               seq_ids: torch.Tensor, *rest: torch.Tensor) -> None:  # fmt: skip
        neuron_config = self.wrapper.neuron_config
        if neuron_config.enable_fused_speculation:
            assert neuron_config.on_device_sampling_config
            draft = self.wrapper.config.fused_spec_config.draft_config.neuron_config
            if draft.on_device_sampling_config is None:
                raise AttributeError("'NoneType' object has no attribute 'do_sample'")
        if self.wrapper.tag == CONTEXT_ENCODING_MODEL_TAG and neuron_config.is_continuous_batching:
            # modules/kvcache/kv_cache_manager.py update_cache: the context-encoding cache write of continuous
            # batching takes one seq_id; the example has ctx_batch_size of them
            assert seq_ids.dim() == 1 and seq_ids.shape[0] == 1, "only supports single seq_id"
        lora_config = neuron_config.lora_config
        if lora_config is not None and self.wrapper.tag == TOKEN_GENERATION_MODEL_TAG:
            # lora_layer.py _einsum_forward ("bij,bjk->bik", 68-71): token generation multiplies the batch
            # by the (batch_size, ...) active LoRA rows; torch broadcasts a batch_size of 1, refuses others
            active, batch = lora_config.batch_size, input_ids.shape[0]
            if active not in (1, batch):
                raise RuntimeError(
                    f"einsum(): subscript b has size {active} for operand 1 which does not broadcast with "
                    f"previously seen size {batch}"
                )


class ModelWrapper(torch.nn.Module):
    def __init__(
        self,
        config: Any,
        model_cls: Any,
        tag: str = "",
        compiler_args: str | None = None,
        priority_model_idx: int | None = None,
        pipeline_execution: bool = False,
        return_ranked_to_cpu: bool = False,
        model_init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.config = config
        self.neuron_config = config.neuron_config
        if not self.neuron_config.torch_dtype:
            self.neuron_config.torch_dtype = torch.float32
        if not hasattr(config, "pad_token_id") or config.pad_token_id is None:
            config.pad_token_id = 0
        self.model_cls = model_cls
        self.model: Any = None
        self.tag = tag
        self.is_block_kv_layout = self.neuron_config.is_block_kv_layout
        self.is_prefix_caching = self.neuron_config.is_prefix_caching
        self.is_medusa = self.neuron_config.is_medusa
        self.is_batch_bucketing = self.neuron_config.token_generation_batches is not None
        base_compile_work_dir = os.environ.get("BASE_COMPILE_WORK_DIR", "/tmp/nxd_model/")
        self.compiler_workdir = os.path.join(base_compile_work_dir, self.tag)
        if compiler_args is None:
            level = " -O1 " if tag == CONTEXT_ENCODING_MODEL_TAG else " -O2 "
            compiler_args = (
                "--auto-cast=none --model-type=transformer --tensorizer-options='--enable-ccop-compute-overlap "
                f"--cc-pipeline-tiling-factor={1 if tag == TOKEN_GENERATION_MODEL_TAG else 2} "
                "--vectorize-strided-dma ' "
                f"--lnc={self.neuron_config.logical_nc_config}{level}"
            )
        self.compiler_args = compiler_args + " --internal-hlo2tensorizer-options='--verify-hlo=true' "
        self.bucket_config = None
        self.priority_model_idx = priority_model_idx
        self.pipeline_execution = pipeline_execution
        self.return_ranked_to_cpu = return_ranked_to_cpu
        self.model_init_kwargs = model_init_kwargs or {}
        self.async_mode = self.neuron_config.async_mode

    def is_neuron(self) -> bool:
        return self.model is not None

    def get_model_instance(self) -> _TraceableInstance:
        return _TraceableInstance(self)

    def input_generator(self) -> list[tuple[torch.Tensor, ...]]:
        """One example per bucket (ModelWrapper.input_generator): the shapes ModelBuilder traces and
        the inputs warmup() runs."""
        inputs = []
        batch_size = self.neuron_config.batch_size
        for bucket in self.neuron_config.buckets:
            n_active_tokens = (
                bucket if self.neuron_config.bucket_n_active_tokens else self.neuron_config.n_active_tokens
            )
            attention_mask = torch.ones((batch_size, bucket), dtype=torch.int32)
            input_ids = torch.ones((batch_size, n_active_tokens), dtype=torch.int32)
            if self.tag != CONTEXT_ENCODING_MODEL_TAG:
                position_ids = torch.ones((batch_size, n_active_tokens), dtype=torch.int32)
            else:
                position_ids = torch.arange(0, n_active_tokens, dtype=torch.int32).unsqueeze(0).repeat(batch_size, 1)
            seq_ids = torch.arange(0, batch_size, dtype=torch.int32)
            adapter_ids = torch.zeros((batch_size), dtype=torch.int32)
            sampling_params = torch.ones((batch_size, 3), dtype=torch.float32)
            sampling_config = self.neuron_config.on_device_sampling_config
            if sampling_config and sampling_config.do_sample:
                sampling_params[:, 0] = sampling_config.top_k
                sampling_params[:, 1] = sampling_config.top_p
                sampling_params[:, 2] = sampling_config.temperature
            hidden_states = torch.zeros((batch_size), dtype=torch.int32)
            inputs.append(
                (input_ids, attention_mask, position_ids, seq_ids, sampling_params, hidden_states, adapter_ids)
            )
        return inputs

    # -- padding and bucketing --------------------------------------------------------
    def _pad_helper(
        self, tensor: torch.Tensor | None, pad_type: str = "fill_0", batch_sort_indices: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        if tensor is None or tensor.shape[0] == self.neuron_config.batch_size:
            return tensor
        padded_shape = list(tensor.shape)
        padded_shape[0] = self.neuron_config.batch_size
        if pad_type == "repeat_first_batchline":
            padded = tensor[:1].expand(*padded_shape).clone()
        elif pad_type in ("fill_0", "fill_1", "fill_-1"):
            padded = torch.full(padded_shape, fill_value=int(pad_type[5:]), dtype=tensor.dtype)
        else:
            raise ValueError(f"Unknown pad_type '{pad_type}'.")
        padded[: tensor.shape[0]] = tensor
        if batch_sort_indices is not None:
            padded = torch.index_select(padded, 0, batch_sort_indices)
        return padded

    def _forward_with_pad(self, *args: torch.Tensor) -> Any:
        seq_ids = args[3]
        sampling_params = args[4]
        extra_args = args[5:8] if len(args) > 5 else ()
        seq_ids_list = seq_ids.tolist()
        target_batch_size = self.neuron_config.max_batch_size
        if self.config.neuron_config.apply_seq_ids_mask:
            seq_ids_mask = torch.tensor([1 if x in seq_ids_list else 0 for x in range(target_batch_size)])
        padded_seq_ids = torch.tensor(
            seq_ids_list + [x for x in range(target_batch_size) if x not in seq_ids_list], dtype=seq_ids.dtype
        )
        padded_seq_ids, indices = torch.sort(padded_seq_ids)
        if self.config.neuron_config.apply_seq_ids_mask:
            padded_seq_ids = torch.where(seq_ids_mask == 1, padded_seq_ids, torch.full_like(padded_seq_ids, -1))
        padded_args: list[Any] = [
            self._pad_helper(arg, pad_type="repeat_first_batchline", batch_sort_indices=indices) for arg in args[0:3]
        ]
        padded_args.append(padded_seq_ids[:target_batch_size])
        padded_args.append(
            self._pad_helper(sampling_params, pad_type="repeat_first_batchline", batch_sort_indices=indices)
        )
        for arg in extra_args:
            padded_args.append(self._pad_helper(arg, batch_sort_indices=indices))
        outputs = self._forward(*padded_args)
        if self._returns_list():
            return [torch.index_select(output, 0, seq_ids) for output in outputs]
        return torch.index_select(outputs, 0, seq_ids)

    def _returns_list(self) -> bool:
        """model_wrapper.py:691-694, 1432-1435: fused speculation, or logits beside on-device tokens."""
        neuron_config = self.neuron_config
        return bool(
            neuron_config.enable_fused_speculation
            or (
                neuron_config.on_device_sampling_config
                and neuron_config.output_logits
                and neuron_config.is_continuous_batching
            )
        )

    def _forward(self, *args: torch.Tensor) -> Any:
        return self.model(*args)

    def convert_int64_to_int32(self, *args: torch.Tensor) -> list[torch.Tensor]:
        return [t.to(torch.int32) if t.dtype == torch.int64 else t for t in args]

    def pad_inputs(self, *args: torch.Tensor, pad_type: str = "first_fit") -> tuple[torch.Tensor, ...]:
        assert pad_type in {"max", "first_fit", "second_fit"}, f"Found {pad_type=}"
        is_cte = self.tag == CONTEXT_ENCODING_MODEL_TAG
        pad_length = self.neuron_config.max_context_length if is_cte else self.neuron_config.max_length
        if pad_type in ("first_fit", "second_fit"):
            pad_length = self.get_target_bucket(*args, strategy=pad_type)
        if is_cte:
            to_pad = args[:3]
            pad_lengths = [pad_length - arg.shape[1] for arg in to_pad]
            if any(length < 0 for length in pad_lengths):
                if not self.neuron_config.allow_input_truncation:
                    raise ValueError(
                        f"Inputs supplied ({to_pad[1].shape[1]} tokens) are longer than max_context_length "
                        f"({self.neuron_config.max_context_length} tokens). To truncate inputs, set "
                        "allow_input_truncation=True."
                    )
                raise NotImplementedError("fake NxD Inference: allow_input_truncation is not modelled")
            pad_values = [self.config.pad_token_id, 0, 1]
            padded = [
                F.pad(arg, (0, length), "constant", value)
                for arg, value, length in zip(to_pad, pad_values, pad_lengths, strict=True)
            ]
            return (*padded, *args[3:])
        input_ids, attention_mask, *rest = args
        pad_len = pad_length - attention_mask.shape[1]
        if pad_len < 0:
            if not self.neuron_config.allow_input_truncation:
                raise ValueError(
                    f"Attention mask supplied (length={attention_mask.shape[1]}) is longer than max_length "
                    f"({self.neuron_config.max_length} tokens). To truncate attention mask, set "
                    "allow_input_truncation=True."
                )
            raise NotImplementedError("fake NxD Inference: allow_input_truncation is not modelled")
        return (input_ids, F.pad(attention_mask, (0, pad_len), "constant", 0), *rest)

    def get_target_bucket(self, *args: torch.Tensor, strategy: str = "first_fit") -> int:
        speculation_length = self.neuron_config.speculation_length if self.tag == FUSED_SPECULATION_MODEL_TAG else 0
        return self._get_seq_bucket(self.neuron_config.buckets, args[1].shape[1], speculation_length, strategy)

    def _get_seq_bucket(self, buckets: list[int], input_len: int, speculation_length: int, strategy: str) -> int:
        required_len = input_len + speculation_length
        largest = buckets[-1]
        for i, bucket in enumerate(buckets):
            if strategy == "first_fit" and required_len < bucket:
                return bucket
            if strategy == "second_fit" and input_len < bucket:
                return buckets[min(i + 1, len(buckets) - 1)]
        if required_len == largest or self.neuron_config.allow_input_truncation:
            return largest
        raise ValueError(f"Input len {input_len} exceeds largest bucket ({largest}) for {self.tag}")

    def _process_args(self, *args: Any) -> tuple[Any, ...]:
        batch = args[3].shape[0]
        args = tuple(args) + (None,) * max(0, 7 - len(args))
        if args[5] is None:
            args = (*args[:5], torch.zeros((batch), dtype=torch.int32), *args[6:])
        if args[6] is None:
            args = (*args[:6], torch.zeros((batch), dtype=torch.int32), *args[7:])
        return args

    def vllm_cte_repadding(self, batch_args: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        actual_len = int(torch.max(batch_args[2])) + 1
        batch_args[0] = batch_args[0][:, :actual_len]
        batch_args[1] = batch_args[1][:, :actual_len]
        batch_args[2] = batch_args[2][:, :actual_len]
        return self.pad_inputs(*batch_args, pad_type="first_fit")

    def forward(self, *args: Any, pad_type: str = "first_fit") -> Any:
        if self.model is None:
            raise RuntimeError("Forward called before load. Run load() or load_state_dict() making calling forward")
        args = self._process_args(*args)
        args = tuple(arg for arg in args if isinstance(arg, torch.Tensor))
        args = tuple(self.convert_int64_to_int32(*args))
        args = self.pad_inputs(*args, pad_type=pad_type)
        rows = args[3].shape[0]
        batch_size = self.neuron_config.batch_size
        if rows == batch_size:
            return self._forward(*args)
        outputs = []
        cur = 0
        while cur < rows:
            if cur + batch_size <= rows:
                batch_args = [arg[cur : cur + batch_size] for arg in args]
                outputs.append(self._forward(*self.vllm_cte_repadding(batch_args)))
            else:
                outputs.append(self._forward_with_pad(*[arg[cur:rows] for arg in args]))
            cur += batch_size
        if self._returns_list():
            return [torch.cat(parts, dim=0) for parts in zip(*outputs, strict=True)]
        return torch.cat(outputs, dim=0)
