"""Mirrors LoraCheckpoint of src/neuronx_distributed_inference/modules/lora_serving/lora_checkpoint.py
(NxDI 0.8.16251, SDK 2.28 commit cd3abf3): how adapter checkpoints become the LoRA weight stacks.
Re-implemented; line numbers are the real file's.

- Formats (36-57, 67-98): a PEFT folder (adapter_config.json for lora_alpha / use_rslora, and any
  *.safetensors / *.bin / *.pt file in it: the last one listed wins; none: ValueError "No valid LoRA
  adapter checkpoint in {path}...") or one NxD checkpoint file holding a "lora_config" entry.
- Matching (100-173): an NxDI LoRA module (e.g. `layers.0.self_attn.q_proj.lora_A`) takes the
  checkpoint tensor with the same layer ("0.self_attn": the two name parts after "layers.") and the
  same "<base module>.lora_A|B"; a module the adapter lacks stays zero.
- Scaling (123-143): lora_A is multiplied **in place** by lora_alpha / r (lora_alpha / sqrt(r) with
  use_rslora; 1.0 without lora_alpha), r being lora_A's first dimension.
- Layout (185-197, 199-217): each tensor is squeeze()d (so an adapter of rank 1 has 1-D tensors and
  fails with IndexError "tuple index out of range" at `shape[1]`, 214-216), then with
  lora_memory_transpose (the default) stored transposed
  (lora_A as (in, r), lora_B as (r, out)) and copied into the top-left corner of its slot in a
  (max_loras, ...) stack padded to max_lora_rank: adapter i of `ckpt_paths` (dict order) in slot i.
  Every stack starts as zeros (262-268), so unused slots are an adapter that changes nothing.
- update_weights_for_lora (232-277): adds the stacks `<module>.weight` and the per-slot
  "active" rows `<module>.weight_active` (zeros, (batch_size, ...)) to the model's state dict. NxD
  calls it while sharding (neuronx_distributed trace/trace.py:637-638, v2.28.0, `preprocess_checkpoint`),
  so with save_sharded_checkpoint the adapters' weights are baked into the pre-sharded files.
- Dynamic multi-LoRA host weights (279-364): update_weights_for_lora_cpu builds (max_cpu_loras, ...)
  stacks from `ckpt_paths_cpu`; shard_cpu_checkpoints returns them per rank and, given a folder,
  writes `{adapter}_tp{rank}_sharded_lora_cpu_checkpoint.safetensors` holding **the whole stacks**
  for every adapter name; load_sharded_cpu_checkpoints reads each adapter's file and stacks the
  stacks (then pads to max_cpu_loras), as the real code does.

Fake simplifications: the "model" is anything with `fake_lora_modules()` (the LoRA modules NxDI would
have injected, models/model_base.py); step 2 (renaming base weights to `.base_layer`) has no
counterpart in the fake's flat HF state dict; LoRA tensors are not split per tp rank (every rank
holds them whole) and stay float32 (the fake device runs float32); GQA KV replication (188-194)
does not arise (the fake has no replicated KV heads).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file

logger = logging.getLogger("Neuron")


class LoraCheckpoint:
    def __init__(self, config: Any) -> None:
        self.lora_config = config
        self.lora_ckpts: dict[str, Any] | None = None
        self.lora_ckpts_cpu: dict[str, Any] | None = None
        if config is not None:
            self.ckpt_paths = config.lora_ckpt_paths
            self.ckpt_paths_cpu = config.lora_ckpt_paths_cpu
        self.lora_weights: dict[str, torch.Tensor] = {}
        self.lora_weights_active: dict[str, torch.Tensor] = {}
        self.lora_weights_cpu: dict[str, torch.Tensor] = {}

    def is_lora_module(self, name: str) -> bool:
        return "lora_A" in name or "lora_B" in name

    # -- reading adapters --------------------------------------------------------------
    def load_lora_state_dicts(self, ckpt_paths: dict[str, str] | None) -> dict[str, Any] | None:
        if ckpt_paths is None:
            return None
        lora_ckpts = {}
        for key, path in ckpt_paths.items():
            assert os.path.exists(path)
            if os.path.isdir(path):
                scaling, state_dict = self._load_lora_state_dict_from_folder(path)
            else:
                scaling, state_dict = self._load_lora_state_dict_from_file(path)
            lora_ckpts[key] = {"lora_scaling": scaling, "state_dict": state_dict}
        return lora_ckpts

    def _extract_lora_scaling(self, lora_adapter_config: dict[str, Any] | None) -> tuple[Any, Any] | None:
        if lora_adapter_config is None:
            return None
        return lora_adapter_config.get("lora_alpha", 0), lora_adapter_config.get("use_rslora", False)

    def _load_lora_state_dict_from_file(self, filename: str) -> tuple[Any, dict[str, Any]]:
        if filename.endswith(".safetensors"):
            state_dict: dict[str, Any] = load_file(filename)
        elif filename.endswith(".bin") or filename.endswith(".pt"):
            state_dict = torch.load(filename, weights_only=False)
        else:
            raise FileNotFoundError(f"Invalid checkpoint filename {filename} for LoRA adapter.")
        scaling = self._extract_lora_scaling(state_dict.get("lora_config"))
        state_dict.pop("lora_config", None)
        return scaling, state_dict

    def _load_lora_state_dict_from_folder(self, path: str) -> tuple[Any, dict[str, Any]]:
        scaling, state_dict = None, None
        for filename in os.listdir(path):
            file_path = os.path.join(path, filename)
            if filename.strip() == "adapter_config.json":
                with open(file_path) as handle:
                    scaling = self._extract_lora_scaling(json.load(handle))
            elif filename.endswith(".safetensors"):
                state_dict = load_file(file_path)
            elif filename.endswith(".bin") or filename.endswith(".pt"):
                state_dict = torch.load(file_path, weights_only=False)
        if state_dict is None:
            raise ValueError(
                f"No valid LoRA adapter checkpoint in {path}."
                "Supported checkpoint formats include '*.safetensors', '*.bin', and '.pt'."
            )
        return scaling, state_dict

    # -- matching a module to its tensor -------------------------------------------------
    def _get_module_checkpoint(self, name: str, lora_ckpt: dict[str, Any]) -> torch.Tensor | None:
        layer, lora_module = self._get_layer_module_name(name), self._get_lora_module_name_in_layer(name)
        for key, weight in lora_ckpt["state_dict"].items():
            if layer != self._get_layer_module_name(key) or lora_module != self._get_lora_module_name_in_layer(key):
                continue
            if "lora_A" in key:
                lora_scaling = lora_ckpt.get("lora_scaling")
                rank = weight.shape[0]
                scaling = 1.0
                if lora_scaling is not None:
                    try:
                        alpha, use_rslora = lora_scaling
                        if alpha != 0:
                            scaling = alpha / rank if not use_rslora else alpha / rank**0.5
                    except (ValueError, TypeError) as exc:
                        logger.warning(f"Error processing lora_scaling: {exc}")
                weight.mul_(scaling)  # in place, as the real one: the loaded state dict now holds scaled A
            return weight
        return None

    def _get_base_module_type(self, name: str) -> str:
        return name.split(".lora")[0].split(".")[-1]

    def _get_layer_module_name(self, name: str) -> str:
        name = name.replace(".weight", "")
        if "layers." in name:
            return ".".join(name.split("layers.")[1].split(".")[:2])
        return self._get_base_module_type(name)

    def _get_lora_module_name_in_layer(self, name: str) -> str | None:
        module_type = self._get_base_module_type(name)
        if "lora_A" in name:
            return f"{module_type}.lora_A"
        if "lora_B" in name:
            return f"{module_type}.lora_B"
        return None

    def _get_module_checkpoints(self, name: str, ckpt_paths: dict[str, str], lora_ckpts: dict[str, Any]) -> list[Any]:
        return [self._get_module_checkpoint(name, lora_ckpts[key]) for key in ckpt_paths]

    def _get_lora_weight(self, weights: torch.Tensor, index: int) -> torch.Tensor:
        return weights[index].squeeze()

    def _convert_lora_weight(self, ckpt: torch.Tensor, module: Any, weight_dtype: torch.dtype) -> torch.Tensor:
        tensor = ckpt.squeeze()
        if self.lora_config.lora_memory_transpose:
            tensor = tensor.t()
        return tensor.to(weight_dtype)

    def _load_lora_weights(
        self, model: Any, ckpt_paths: dict[str, str], lora_ckpts: dict[str, Any] | None, lora_weights: dict[str, Any]
    ) -> None:
        if lora_ckpts is None:
            return
        for module in model.fake_lora_modules():
            checkpoints = self._get_module_checkpoints(module.name, ckpt_paths, lora_ckpts)
            weights = lora_weights[f"{module.name}.weight"]
            for i, ckpt in enumerate(checkpoints):
                if ckpt is None:
                    continue
                slot = self._get_lora_weight(weights, i)
                converted = self._convert_lora_weight(ckpt, module, module.get_weight_dtype())
                shape = converted.size()  # after squeeze(): a rank-1 adapter's tensors are 1-D here,
                slot[: shape[0], : shape[1]].copy_(converted)  # so shape[1] raises IndexError, as in the real one

    # -- the model's state dict ----------------------------------------------------------
    def update_weights_for_lora(self, model: Any, model_sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if not self.lora_ckpts:
            self.lora_ckpts = self.load_lora_state_dicts(self.ckpt_paths)
        for module in model.fake_lora_modules():
            weight_name = f"{module.name}.weight"
            if weight_name not in model_sd:
                dtype = module.get_weight_dtype()
                self.lora_weights[weight_name] = torch.zeros(*module.get_checkpoint_shape(), dtype=dtype)
                self.lora_weights_active[weight_name + "_active"] = torch.zeros(
                    *module.get_checkpoint_shape_active(), dtype=dtype
                )
        self._load_lora_weights(model, self.ckpt_paths, self.lora_ckpts, self.lora_weights)
        model_sd.update(self.lora_weights)
        model_sd.update(self.lora_weights_active)
        return model_sd

    # -- dynamic multi-LoRA: the host copies -----------------------------------------------
    def update_weights_for_lora_cpu(self, model: Any) -> None:
        if not self.lora_ckpts_cpu:
            self.lora_ckpts_cpu = self.load_lora_state_dicts(self.ckpt_paths_cpu)
        for module in model.fake_lora_modules():
            shape = (self.lora_config.max_cpu_loras, *module.get_checkpoint_shape()[1:])
            self.lora_weights_cpu[f"{module.name}.weight"] = torch.zeros(*shape, dtype=module.get_weight_dtype())
        self._load_lora_weights(model, self.ckpt_paths_cpu, self.lora_ckpts_cpu, self.lora_weights_cpu)

    def shard_cpu_checkpoints(
        self, start_rank_id: int, local_ranks_size: int, tp_deg: int, model: Any, serialize_path: str | None = None
    ) -> list[dict[str, torch.Tensor]]:
        names = self.ckpt_paths_cpu.keys()
        return [
            self._shard_cpu_weights(rank, tp_deg, model, self.lora_weights_cpu, names, serialize_path)
            for rank in range(start_rank_id, start_rank_id + local_ranks_size)
        ]

    def _shard_cpu_weights(
        self,
        rank: int,
        tp_deg: int,
        model: Any,
        checkpoint: dict[str, torch.Tensor],
        adapter_names: Any,
        serialize_path: str | None = None,
    ) -> dict[str, torch.Tensor]:
        sharded = checkpoint.copy()  # the fake does not cut LoRA tensors per rank (module docstring)
        if serialize_path is not None:
            assert len(adapter_names) > 0
            for adapter_name in adapter_names:
                filename = f"{adapter_name}_tp{rank}_sharded_lora_cpu_checkpoint.safetensors"
                save_dict = {k: v.contiguous() for k, v in sharded.items() if "lora_A" in k or "lora_B" in k}
                save_file(save_dict, os.path.join(serialize_path, filename))
        return sharded

    def load_sharded_cpu_checkpoints(
        self, compiled_model_path: str, start_rank_id: int, local_ranks_size: int
    ) -> list[dict[str, Any]]:
        return [
            self._load_rank_checkpoint(compiled_model_path, rank)
            for rank in range(start_rank_id, start_rank_id + local_ranks_size)
        ]

    def _load_rank_checkpoint(self, compiled_model_path: str, rank: int) -> dict[str, Any]:
        load_dict: dict[str, Any] = {}
        for adapter_name in self.ckpt_paths_cpu:
            filename = f"{adapter_name}_tp{rank}_sharded_lora_cpu_checkpoint.safetensors"
            path = os.path.join(compiled_model_path, "weights", filename)
            for key, value in load_file(path).items():
                if "lora_A" in key or "lora_B" in key:
                    load_dict.setdefault(key, []).append(value)
                else:
                    load_dict[key] = value
        for key, value in load_dict.items():
            if "lora_A" in key or "lora_B" in key:
                while len(value) < self.lora_config.max_cpu_loras:
                    value.append(torch.zeros(value[0].shape, dtype=value[0].dtype))
                load_dict[key] = torch.stack(value)
        return load_dict
