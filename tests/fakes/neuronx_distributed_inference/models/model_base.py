"""Mirrors NeuronBaseForCausalLM of src/neuronx_distributed_inference/models/model_base.py
(NxDI 0.8.16251, SDK 2.28 commit cd3abf3), for continuous batching with right padding.

Construction builds two sub-models (ModelWrapper): context encoding (batch
`ctx_batch_size`, buckets from autobucketing.generate_buckets_for_cte) and token generation
(batch `tkg_batch_size`, generate_buckets_for_tkg). Under continuous batching the KV cache
manager asserts, **while compile() traces the context-encoding model**, that it gets a
single seq_id: ctx_batch_size must be 1 (it defaults to batch_size), else compile() raises
AssertionError("only supports single seq_id").

`forward(input_ids=None, seq_ids=None, attention_mask=None, position_ids=None,
past_key_values=None, inputs_embeds=None, sampling_params=None, prev_hidden=None, ...)` -
note that seq_ids is the second positional parameter: pass everything by keyword.
- attention_mask None: inferred from position_ids (`_infer_attention_mask`): for a (n, T>1)
  call `position_ids >= arange(T)`; for a (n, 1) call a (n, max(position_ids)) mask of the
  positions before each row's. seq_ids None: arange(n). sampling_params None: the default
  (batch_size, 3) rows of [1, 1.0, 1.0] (whose shape only fits a full batch).
- With on-device sampling, sampling_params are validated (ValueError) first; every call
  then runs infer_sampling_params, which rewrites rows with temperature 0 in place.
- **prefill iff position_ids.min() == 0** (`_is_prefill`), whatever the shape; otherwise
  token generation. There is no mixed call: a decode row at position 0, or a prefill row
  whose positions do not start at 0, goes to the other program.
- Returns CausalLMOutputWithPast. Without on-device sampling: `.logits` float32
  (rows, 1, vocab_size) (see models/_device.py for the last pad_size columns, which are
  finfo(float32).min when tp_degree does not divide vocab_size), `.hidden_states` and
  `.tokens` are the same tensor. With on-device sampling: `.logits` is **None**, `.tokens`
  (and `.hidden_states`) are the int32 tokens, shape (rows,); with output_logits too,
  `.tokens` and `.logits` (rows, 1, vocab padded to tp_degree), `.hidden_states` [].

With a lora_config (modules/lora_serving/): the LoRA modules are injected at construction
(model_base.py:127-129; the fake computes them, lora_model.fake_lora_modules, and raises the
injection's errors there, where the real one raises when the traced model is built);
`update_weights_for_lora` adds the LoRA weights to what NxD shards (1637-1638); forward passes
`adapter_ids` (adapter indices, one per row) to both programs, and with dynamic_multi_lora a
context encoding first swaps the rows' adapters into device memory and turns the indices into
device positions (3388-3396). The call log's forward lines then carry `adapter_ids` (as given, None
when omitted) and, after a swap, `adapter_positions`.

Fused EAGLE speculation (enable_fused_speculation with enable_eagle_speculation and a
`fused_spec_config`): construction builds the context-encoding model and a fused speculation model
(tag fused_speculation_model, batch tkg_batch_size, the token-generation buckets) instead of token
generation (model_base.py:3099-3102, 3120-3147), both with `_model_cls` NeuronFusedSpecModel; without a
fused_spec_config that raises AttributeError ('NoneType' object has no attribute 'draft_config',
3123-3127, 3152-3156). The weights NxD shards are the draft's (from fused_spec_config.draft_model_path,
keys prefixed `draft_model.`) and the target's (`target_model.`) (application_base.py:658-671,
733-736). A call is a prefill iff position_ids.min() == 0 as before; otherwise it goes to the fused
model (3718-3728). The output (3872-3874): `.fused_outputs` (also `.hidden_states`) is the list
[accepted tokens (rows, speculation_length) int32 padded with -1, next input ids (rows, 1), next
attention mask, next position ids (rows, 1)]; `.logits` None; no `.tokens`. A prefill answers the
same layout, its token in column 0 (`_cte_postprocessor` 2798-2839). What the device does per call:
models/_device.py. The forward lines of the call log carry `accepted` (per row, the tokens taken)
for a fused decode.

Fake limitations (NotImplementedError at construction): anything but continuous batching
with right padding, ctx/tkg/max/kv-cache batch sizes other than batch_size (ctx_batch_size
apart), async mode, speculation other than fused EAGLE (draft-model speculation, fused speculation
without EAGLE, Medusa, token trees), fused speculation with LoRA, output_logits or
apply_seq_ids_mask, prefix caching / block KV, chunked prefill, attention DP / CP, flash decoding,
windowed context encoding, batch bucketing, tensor capture/replacement, output_logits without
on-device sampling; a call with more decode rows than tkg_batch_size.

The fake logs each call as `forward` with kind (context / decode), rows, length, seq_ids
(as the caller gave them, None when omitted), positions ([min, max] per row),
sampling_params (after the defaults and the temperature-0 rewrite), vocab_padded
(vocab_size rounded up to a multiple of tp_degree), and `programs`: each program run
(tag, bucket, batch, the seq_ids it got, the KV writes [line, first position, count]).
A decode also logs `filled_seq_ids` (the slots NxDI added to a partial batch),
`seq_ids_ignored` (a full batch whose seq_ids are not 0..batch-1) and `overwritten`
([line, position] a partial batch's filler rows wrote over: a line outside the call, at a
position below data that line already held).
"""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from neuronx_distributed_inference import _calllog, _hold
from neuronx_distributed_inference.models.application_base import NeuronApplicationBase
from neuronx_distributed_inference.models.model_wrapper import (
    CONTEXT_ENCODING_MODEL_TAG,
    FUSED_SPECULATION_MODEL_TAG,
    TOKEN_GENERATION_MODEL_TAG,
    ModelWrapper,
)
from neuronx_distributed_inference.modules import autobucketing
from neuronx_distributed_inference.modules.generation.sampling import (
    infer_sampling_params,
    prepare_sampling_params,
    validate_sampling_params,
)
from neuronx_distributed_inference.modules.lora_serving.lora_model import (
    FakeLoraModule,
    LoraWeightManager,
    fake_lora_modules,
)


class NeuronBaseModel(torch.nn.Module):
    """The traced model class (attention, KV cache, LM head, sampler). The fake's device
    (models/_device.py) plays its part; the class exists for `_model_cls` references."""

    def __init__(self, config: Any, optimize_inference: bool = True) -> None:
        super().__init__()
        self.config = config
        self.neuron_config = config.neuron_config


class NeuronFusedSpecModel(torch.nn.Module):
    """model_base.py:1641-3063: the draft and the target traced into one program. The fake's device plays
    its part; the class exists for `_model_cls` references and what to_dict writes."""

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config = config
        self.neuron_config = config.neuron_config


class NeuronBaseForCausalLM(NeuronApplicationBase):
    _model_cls: Any = None
    # the fake's model-family check: the HF model_types a class can serve (None: any)
    _fake_model_types: ClassVar[tuple[str, ...] | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.text_config = self.config.get_text_config()
        self.vocab_size = self.text_config.vocab_size
        self.padding_side = self.neuron_config.padding_side
        self.kv_cache_populated = False
        self.async_mode = self.neuron_config.async_mode
        self.sampler = None
        self.default_sampling_params = prepare_sampling_params(
            batch_size=self.neuron_config.batch_size, top_k=[1], top_p=[1.0], temperature=[1.0]
        )
        self.model_wrapper = self.get_model_wrapper_cls()
        if self.neuron_config.is_chunked_prefill:
            raise NotImplementedError("Chunked Prefill is not available in NxDI for now")
        self._fake_check_supported()
        self._lora_modules: list[FakeLoraModule] = []
        lora_config = self.neuron_config.lora_config
        if lora_config is not None:  # model_base.py:127-129: NeuronBaseModel wraps itself with LoRA
            self._lora_modules = fake_lora_modules(self.config, lora_config)
            self.lora_weight_manager = LoraWeightManager(lora_config, self)
        if self.neuron_config.enable_fused_speculation:  # model_base.py:3099-3102
            self._model_cls = NeuronFusedSpecModel
            self.enable_context_encoding()
            self.enable_fused_spec()
        else:
            self.enable_context_encoding()
            self.enable_token_generation()
        self._fake_decode_steps: dict[int, int] = {}

    def _fake_check_supported(self) -> None:
        model_type = getattr(self.config, "model_type", None)
        if self._fake_model_types is not None and model_type not in self._fake_model_types:
            raise ValueError(
                f"fake NxD Inference: {type(self).__name__} cannot serve a {model_type!r} checkpoint (it serves "
                f"{list(self._fake_model_types)}); the real class would trace without complaint and then fail to "
                "load the weights or serve garbage"
            )
        nc = self.neuron_config
        unsupported = {
            "is_continuous_batching=False": not nc.is_continuous_batching,
            f"padding_side={nc.padding_side!r}": nc.padding_side != "right",
            "tkg_batch_size != batch_size": nc.tkg_batch_size != nc.batch_size,
            "max_batch_size != batch_size": nc.max_batch_size != nc.batch_size,
            "kv_cache_batch_size != batch_size": nc.kv_cache_batch_size != nc.batch_size,
            "async_mode": nc.async_mode,
            "speculation other than fused EAGLE": (nc.speculation_length > 0 or nc.enable_fused_speculation)
            and not (nc.enable_fused_speculation and nc.enable_eagle_speculation),
            "medusa_speculation_length": nc.medusa_speculation_length > 0,
            "token_tree_config": nc.enable_token_tree,
            "fused speculation with lora_config, output_logits or apply_seq_ids_mask": nc.enable_fused_speculation
            and (nc.lora_config is not None or nc.output_logits or nc.apply_seq_ids_mask),
            "is_medusa": nc.is_medusa,
            "prefix caching / block KV": nc.is_prefix_caching or nc.is_block_kv_layout,
            "attention_dp_degree / cp_degree > 1": nc.attention_dp_degree > 1 or nc.cp_degree > 1,
            "flash_decoding_enabled": nc.flash_decoding_enabled,
            "windowed_context_encoding_size": nc.windowed_context_encoding_size is not None,
            "token_generation_batches": nc.token_generation_batches is not None,
            "tensor capture / replacement": bool(nc.tensor_capture_config or nc.tensor_replacement_config),
            "output_logits without on_device_sampling_config": nc.output_logits and not nc.on_device_sampling_config,
            "pp_degree / ep_degree > 1": nc.pp_degree > 1 or nc.ep_degree > 1,
        }
        wanted = [name for name, on in unsupported.items() if on]
        if wanted:
            raise NotImplementedError(
                f"fake NxD Inference models continuous batching with right padding only; not modelled: {wanted}"
            )

    def fake_lora_modules(self) -> list[FakeLoraModule]:
        """The LoRA modules NxDI injected (lora_model.py `inject_adapter`); [] without LoRA."""
        return self._lora_modules

    def update_weights_for_lora(self, model_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """model_base.py:1637-1638."""
        return self.lora_weight_manager.lora_checkpoint.update_weights_for_lora(self, model_sd)

    def get_model_wrapper_cls(self) -> type[ModelWrapper]:
        return ModelWrapper

    def enable_context_encoding(self, **model_init_kwargs: Any) -> None:
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.ctx_batch_size
        if self.neuron_config.enable_fused_speculation:  # model_base.py:3152-3156
            new_config.fused_spec_config.draft_config.neuron_config.batch_size = self.neuron_config.ctx_batch_size
            new_config.fused_spec_config.draft_config.neuron_config.is_prefill_stage = True
        new_config.neuron_config.n_active_tokens = self.neuron_config.max_context_length
        new_config.neuron_config.bucket_n_active_tokens = True
        new_config.neuron_config.is_prefill_stage = True
        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_cte(new_config)
        self.context_encoding_model = self.model_wrapper(
            config=new_config,
            model_cls=self._model_cls,
            tag=CONTEXT_ENCODING_MODEL_TAG,
            compiler_args=self.get_compiler_args(),
            model_init_kwargs=model_init_kwargs,
        )
        self.models.append(self.context_encoding_model)

    def enable_token_generation(self, enable_wlt_optimization: bool = True, **model_init_kwargs: Any) -> None:
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.tkg_batch_size
        new_config.neuron_config.n_active_tokens = 1
        new_config.neuron_config.bucket_n_active_tokens = False
        new_config.neuron_config.sequence_parallel_enabled = False
        new_config.neuron_config.is_prefill_stage = False
        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_tkg(new_config)
        self.token_generation_model = self.model_wrapper(
            config=new_config,
            model_cls=self._model_cls,
            tag=TOKEN_GENERATION_MODEL_TAG,
            compiler_args=self.get_compiler_args(),
            priority_model_idx=0 if enable_wlt_optimization else None,
            model_init_kwargs=model_init_kwargs,
        )
        self.models.append(self.token_generation_model)

    def enable_fused_spec(self) -> None:
        """model_base.py:3120-3147."""
        new_config = copy.deepcopy(self.config)
        new_config.neuron_config.batch_size = self.neuron_config.tkg_batch_size
        draft = new_config.fused_spec_config.draft_config.neuron_config
        draft.batch_size = self.neuron_config.tkg_batch_size
        draft.n_active_tokens = 1
        new_config.neuron_config.n_active_tokens = 1
        new_config.neuron_config.bucket_n_active_tokens = False
        new_config.neuron_config.is_prefill_stage = False
        new_config.neuron_config.buckets = autobucketing.generate_buckets_for_fused_spec(new_config)
        new_config.neuron_config.sequence_parallel_enabled = False
        draft.sequence_parallel_enabled = False
        self.fused_spec_model = self.model_wrapper(
            config=new_config,
            model_cls=self._model_cls,
            tag=FUSED_SPECULATION_MODEL_TAG,
            compiler_args=self.get_compiler_args(),
            priority_model_idx=None if new_config.neuron_config.is_full_model_shuffled else 0,
        )
        self.models.append(self.fused_spec_model)

    def get_generation_model(self) -> ModelWrapper:
        if self.neuron_config.enable_fused_speculation:
            return self.fused_spec_model
        return self.token_generation_model

    # -- forward ------------------------------------------------------------------------
    def preprocess_inputs(
        self,
        input_ids: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        sampling_params: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        if attention_mask is None:
            attention_mask = self._infer_attention_mask(position_ids)
        if seq_ids is None:
            seq_ids = torch.arange(input_ids.shape[0])
        sampling_params = self.default_sampling_params if sampling_params is None else sampling_params
        self.validate_sampling_params(sampling_params)
        sampling_params = infer_sampling_params(sampling_params)
        self.sampling_params = sampling_params
        return input_ids, attention_mask, position_ids, seq_ids, sampling_params

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        seq_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        past_key_values: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        sampling_params: torch.Tensor | None = None,
        prev_hidden: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        adapter_ids: torch.Tensor | None = None,
        medusa_args: Any = None,
        return_dict: bool | None = None,
        llava_args: list[Any] = [],  # noqa: B006 - the real signature's default
        input_capture_hook: Any = None,
        slot_mapping: torch.Tensor | None = None,
        block_table: torch.Tensor | None = None,
        full_context_lens: torch.Tensor | None = None,
        computed_context_lens: torch.Tensor | None = None,
        tf_args: list[torch.Tensor] | None = None,
    ) -> CausalLMOutputWithPast:
        if inputs_embeds is not None or llava_args or medusa_args is not None or slot_mapping is not None:
            raise NotImplementedError("fake NxD Inference: inputs_embeds / llava / medusa / block KV inputs")
        caller_seq_ids = None if seq_ids is None else seq_ids.reshape(-1).tolist()
        caller_adapter_ids = None if adapter_ids is None else adapter_ids.reshape(-1).tolist()
        adapter_positions = None
        lora_config = self.neuron_config.lora_config
        is_context_encoding = input_ids.shape[-1] > 1 and not position_ids.min().item()
        if lora_config and lora_config.dynamic_multi_lora and is_context_encoding:  # model_base.py:3388-3396
            traced = self.traced_model
            assert traced is not None
            adapter_ids = self.lora_model_manager.dynamic_update_weights_for_lora(
                traced.lora_device_weights(), adapter_ids
            )
            adapter_positions = adapter_ids.tolist()
            for adapter, position in zip(caller_adapter_ids or [], adapter_positions, strict=True):
                traced.lora_slot_labels[position] = adapter  # what the swap put there
        input_ids, attention_mask, position_ids, seq_ids, sampling_params = self.preprocess_inputs(
            input_ids=input_ids,
            seq_ids=seq_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            sampling_params=sampling_params,
        )
        prefill = self._is_prefill(position_ids)
        traced = self.traced_model
        if traced is not None:
            traced.trace_log.clear()
        outputs, _ = self._get_model_outputs(
            input_ids, attention_mask, position_ids, seq_ids, sampling_params, prev_hidden, adapter_ids
        )
        accepted = None
        if self.neuron_config.enable_fused_speculation and not prefill:
            accepted = [[int(t) for t in row if t >= 0] for row in outputs[0].tolist()]
        self._fake_log_forward(
            prefill,
            input_ids,
            position_ids,
            seq_ids,
            caller_seq_ids,
            sampling_params,
            caller_adapter_ids,
            adapter_positions,
            accepted,
        )
        fused = self.neuron_config.enable_fused_speculation
        if self.on_device_sampling and self.neuron_config.output_logits and not fused:
            return self._construct_output_with_tokens_and_logits(next_tokens=outputs[0], logits=outputs[1])
        return self._construct_output(outputs)

    def validate_sampling_params(self, params: torch.Tensor) -> None:
        if self.on_device_sampling:
            validate_sampling_params(params, self.neuron_config.on_device_sampling_config)

    def _infer_attention_mask(self, position_ids: torch.Tensor | None, *args: Any) -> torch.Tensor:
        assert position_ids is not None, "need to call forward with position_ids if attention_mask is not provided"
        batch_size, seq_len = position_ids.shape
        if position_ids.shape[-1] != 1:
            seq_len = position_ids.shape[-1]
            to_compare = position_ids
        else:
            seq_len = int(torch.max(position_ids))
            to_compare = position_ids.expand(batch_size, seq_len) - 1
        mask = torch.arange(seq_len).view(1, -1).expand(batch_size, seq_len)
        return (to_compare >= mask).to(dtype=position_ids.dtype)

    def _is_prefill(self, position_ids: torch.Tensor) -> bool:
        return position_ids.min().item() == 0

    def _get_model_outputs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        sampling_params: torch.Tensor,
        prev_hidden: torch.Tensor | None,
        adapter_ids: torch.Tensor | None,
        *rest: Any,
    ) -> tuple[Any, bool]:
        if self._is_prefill(position_ids):
            outputs = self.context_encoding_model(
                input_ids, attention_mask, position_ids, seq_ids, sampling_params, prev_hidden, adapter_ids
            )
            self.kv_cache_populated = True
            return outputs, self.context_encoding_model.is_neuron()
        if self.neuron_config.enable_fused_speculation:  # model_base.py:3718-3728
            outputs = self.fused_spec_model(
                input_ids, attention_mask, position_ids, seq_ids, sampling_params, prev_hidden, adapter_ids
            )
            return outputs, self.fused_spec_model.is_neuron()
        if input_ids.shape[0] > self.neuron_config.tkg_batch_size:
            raise NotImplementedError(
                f"fake NxD Inference: a decode of {input_ids.shape[0]} rows, more than tkg_batch_size "
                f"{self.neuron_config.tkg_batch_size} (the real one runs it in slices, the first ignoring seq_ids)"
            )
        outputs = self.token_generation_model(
            input_ids, attention_mask, position_ids, seq_ids, sampling_params, prev_hidden, adapter_ids
        )
        return outputs, self.token_generation_model.is_neuron()

    def _construct_output_with_tokens_and_logits(
        self, next_tokens: torch.Tensor, logits: torch.Tensor, hidden_states: Any = None
    ) -> CausalLMOutputWithPast:
        output = CausalLMOutputWithPast(logits=logits, hidden_states=hidden_states or [], attentions=None)
        output.tokens = next_tokens
        return output

    def _construct_output(self, logits_or_next_tokens: Any) -> CausalLMOutputWithPast:
        output = CausalLMOutputWithPast(
            logits=None if self.on_device_sampling else logits_or_next_tokens,
            hidden_states=logits_or_next_tokens,
            attentions=None,
        )
        if self.neuron_config.enable_fused_speculation:  # model_base.py:3872-3874
            output.fused_outputs = logits_or_next_tokens
            output.async_should_stop = False
        else:
            output.tokens = logits_or_next_tokens
        return output

    def reset(self) -> None:
        self.kv_cache_populated = False

    def get_required_kwargs(self) -> list[str]:
        return []

    # -- the fake's bookkeeping (call log, hold hook) ---------------------------------------
    def _fake_log_forward(
        self,
        prefill: bool,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        seq_ids: torch.Tensor,
        caller_seq_ids: list[int] | None,
        sampling_params: torch.Tensor,
        caller_adapter_ids: list[int] | None = None,
        adapter_positions: list[int] | None = None,
        accepted: list[list[int]] | None = None,
    ) -> None:
        traced = self.traced_model
        programs = list(traced.trace_log) if traced is not None else []
        given = [int(x) for x in seq_ids.reshape(-1).tolist()]
        fields: dict[str, Any] = {
            "kind": "context" if prefill else "decode",
            "rows": int(input_ids.shape[0]),
            "length": int(input_ids.shape[-1]),
            "seq_ids": caller_seq_ids,
            "positions": [[int(p.min()), int(p.max())] for p in position_ids],
            "sampling_params": sampling_params.tolist(),
            "vocab_padded": self.vocab_size + (-self.vocab_size) % self.neuron_config.tp_degree,
            "programs": programs,
        }
        if accepted is not None:
            fields["accepted"] = accepted
        if self.neuron_config.lora_config is not None:
            fields["adapter_ids"] = caller_adapter_ids
            if adapter_positions is not None:
                fields["adapter_positions"] = adapter_positions
        if prefill:
            for slot in given:
                self._fake_decode_steps[slot] = 0
        else:
            batch = self.neuron_config.tkg_batch_size
            fields["filled_seq_ids"] = [x for x in range(batch) if x not in given] if len(given) < batch else []
            fields["seq_ids_ignored"] = len(given) == batch and given != list(range(batch))
            overwritten = []
            if len(given) < batch and programs:
                for line, position, _ in programs[-1]["writes"]:
                    if line not in given and position < self._fake_written_before(line, position):
                        overwritten.append([line, position])
            fields["overwritten"] = overwritten
            for slot in set(given):
                self._fake_decode_steps[slot] = self._fake_decode_steps.get(slot, 0) + 1
        _calllog.record("forward", **fields)
        if not prefill:
            _hold.maybe_hold(self._fake_decode_steps.get(slot, 0) for slot in set(given))

    def _fake_written_before(self, line: int, position: int) -> int:
        """1 + the highest position of `line` holding data other than the filler's own write (0: none)."""
        traced = self.traced_model
        if traced is None or traced.kv_tokens is None:
            return 0
        written = (traced.kv_tokens[line] >= 0).nonzero().flatten().tolist()
        others = [p for p in written if p != position]
        return max(others) + 1 if others else 0
