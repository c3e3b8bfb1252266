"""Mirrors src/neuronx_distributed_inference/modules/lora_serving/config.py of NxD Inference at the
SDK 2.28 release commit cd3abf3 (NxDI 0.8.16251): LoraServingConfig, re-implemented (no code copied),
same keywords, defaults, derived values and errors. Line numbers are the real file's.

- Keywords and defaults (9-28): max_loras 1, max_lora_rank 16, max_cpu_loras 100, batch_size 1,
  target_modules None, lora_bias "none", lora_ckpt_paths / lora_ckpt_paths_cpu None (a dict name ->
  path, or a list of "name:path" strings, 139-143), lora_ckpt_json None (a JSON file with
  "lora-ckpt-dir" (default: the working directory), "lora-ckpt-paths" and "lora-ckpt-paths-cpu",
  107-122), lora_memory_transpose True, lora_shard_linear_layer True, is_context_encoding False,
  dynamic_multi_lora False, eviction_policy "lru", lfu_decay_period 128, base_model_quantized False.
  There is no `enable_base_model_only` (it arrives with SDK 2.29): index 0 is the first adapter.
- lora_ckpt_paths_cpu is `cpu paths | lora_ckpt_paths` with dynamic_multi_lora, else {} (47).
- Errors: a path that does not exist, FileNotFoundError "LoRA adapter path {path} for adapter ID {id}
  is not found. Please check lora_ckpt_path and try again." (78-85); the JSON's directory missing (87-92);
  an adapter ID twice (json + paths), ValueError (94-100); with dynamic_multi_lora more host
  checkpoints than max_cpu_loras, ValueError "The total number of LoRA checkpoints specified in {json}
  is {n}, but the maximum number of adapters that can be hosted on CPU is {max}." (155-159); a folder
  without adapter_config.json, FileNotFoundError "No LoRA configuration json file is found in {folder}"
  (172-179); a file that is not .safetensors/.bin/.pt, FileNotFoundError "Invalid checkpoint filename
  {f} for LoRA adapter." (181-187).
- Silent adjustments (warnings only): max_loras raised to the number of device checkpoints (151-153);
  target_modules replaced by the union of the adapters' own when None or not a superset of it (61-67);
  max_lora_rank raised to the adapters' highest rank (68-73).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import torch
from safetensors.torch import load_file


class LoraServingConfig:
    def __init__(
        self,
        max_loras: int = 1,
        max_lora_rank: int = 16,
        max_cpu_loras: int = 100,
        batch_size: int = 1,
        target_modules: list[str] | None = None,
        lora_bias: str = "none",
        lora_ckpt_paths: list[str] | dict[str, str] | None = None,
        lora_ckpt_paths_cpu: list[str] | dict[str, str] | None = None,
        lora_ckpt_json: str | None = None,
        lora_memory_transpose: bool = True,
        lora_shard_linear_layer: bool = True,
        is_context_encoding: bool = False,
        dynamic_multi_lora: bool = False,
        eviction_policy: str = "lru",
        lfu_decay_period: int = 128,
        base_model_quantized: bool = False,
    ) -> None:
        self.max_loras = max_loras
        self.max_lora_rank = max_lora_rank
        self.max_cpu_loras = max_cpu_loras
        self.batch_size = batch_size
        self.target_modules = target_modules
        self.lora_bias = lora_bias
        self.dynamic_multi_lora = dynamic_multi_lora
        self.eviction_policy = eviction_policy
        self.lfu_decay_period = lfu_decay_period
        self.lora_ckpt_json = lora_ckpt_json
        self.lora_ckpt_paths = self.convert_ckpt_paths_to_dict(lora_ckpt_paths)
        self.lora_ckpt_paths_cpu = (
            self.convert_ckpt_paths_to_dict(lora_ckpt_paths_cpu, is_cpu=True) | self.lora_ckpt_paths
            if self.dynamic_multi_lora
            else {}
        )
        self._check_ckpt_config()
        self.lora_memory_transpose = lora_memory_transpose
        self.lora_shard_linear_layer = lora_shard_linear_layer
        self.is_context_encoding = is_context_encoding
        self.base_model_quantized = base_model_quantized

        from_ckpts = self.get_lora_config_from_ckpt_paths()
        ckpt_targets, ckpt_rank = from_ckpts["target_modules"], from_ckpts["max_lora_rank"]
        if self.target_modules is None or not set(ckpt_targets).issubset(set(self.target_modules)):
            logging.warning(
                f"Setting target modules to {ckpt_targets} based on the LoRA configurations in checkpoint paths."
            )
            self.target_modules = ckpt_targets
        if self.max_lora_rank < ckpt_rank:
            logging.warning(
                f"Setting max_lora_rank to {ckpt_rank} based on the LoRA configurations in checkpoint paths. "
                f"This is greater than the specified max_lora_rank: {self.max_lora_rank}."
            )
            self.max_lora_rank = ckpt_rank

    # -- paths ---------------------------------------------------------------------------
    def _expand_user_path(self, path: str) -> str:
        return os.path.expanduser(path)

    def _check_valid_path(self, path: str, adapter_id: str | None = None) -> str:
        path = self._expand_user_path(path)
        if not os.path.exists(path):
            raise FileNotFoundError(
                f"LoRA adapter path {path} for adapter ID {adapter_id} is not found. "
                "Please check lora_ckpt_path and try again."
            )
        return path

    def _check_valid_dir(self, directory: str) -> None:
        if not os.path.isdir(directory):
            raise FileNotFoundError(
                f"The LoRA checkpoint directory {directory} specified in {self.lora_ckpt_json} doesn't exist. "
                "Please check lora-ckpt-dir and try again."
            )

    def _check_valid_adapter_id(self, adapter_id: str, ckpt_path_dict: dict[str, str]) -> None:
        if adapter_id in ckpt_path_dict:
            raise ValueError(
                f"The adapter ID {adapter_id} appears more than once in lora_ckpt_paths. "
                "Please check lora_ckpt_path and try again."
            )

    def _check_valid_adapter_id_path(self, adapter_id: str, path: str, ckpt_path_dict: dict[str, str]) -> str:
        path = self._check_valid_path(path, adapter_id)
        self._check_valid_adapter_id(adapter_id, ckpt_path_dict)
        return path

    def parse_lora_ckpts_from_json(self, is_cpu: bool) -> dict[str, str]:
        if self.lora_ckpt_json is None:
            return {}
        json_path = self._check_valid_path(self.lora_ckpt_json)
        with open(json_path) as handle:
            content = json.load(handle)
            ckpt_dir = content.get("lora-ckpt-dir", os.getcwd())
            self._check_valid_dir(ckpt_dir)
            entries = content["lora-ckpt-paths-cpu"] if is_cpu else content["lora-ckpt-paths"]
        ckpt_path_dict: dict[str, str] = {}
        for adapter_id, path in entries.items():
            full = os.path.join(ckpt_dir, path)
            ckpt_path_dict[adapter_id] = self._check_valid_adapter_id_path(adapter_id, full, ckpt_path_dict)
        return ckpt_path_dict

    def convert_ckpt_paths_to_dict(self, lora_ckpt_paths: Any, is_cpu: bool = False) -> dict[str, str]:
        ckpt_path_dict = self.parse_lora_ckpts_from_json(is_cpu)
        if lora_ckpt_paths is None:
            if not ckpt_path_dict:
                what = "LoRA CPU adapter IDs" if is_cpu else "LoRA adapter IDs"
                logging.warning(f"No {what} and checkpoint paths are initialized.")
            return ckpt_path_dict
        if isinstance(lora_ckpt_paths, dict):
            for adapter_id, path in lora_ckpt_paths.items():
                ckpt_path_dict[adapter_id] = self._check_valid_adapter_id_path(adapter_id, path, ckpt_path_dict)
            return ckpt_path_dict
        for entry in lora_ckpt_paths:
            key, value = entry.split(":")[0].strip(), entry.split(":")[1].strip()
            ckpt_path_dict[key] = self._check_valid_adapter_id_path(key, value, ckpt_path_dict)
        return ckpt_path_dict

    def _check_ckpt_config(self) -> None:
        num_ckpts = len(self.lora_ckpt_paths)
        num_ckpts_cpu = len(self.lora_ckpt_paths_cpu)
        if self.max_loras < num_ckpts:
            logging.warning(f"Setting the number of LoRA adapters in HBM to {num_ckpts}.")
            self.max_loras = num_ckpts
        if self.dynamic_multi_lora and num_ckpts_cpu > self.max_cpu_loras:
            raise ValueError(
                f"The total number of LoRA checkpoints specified in {self.lora_ckpt_json} is {num_ckpts_cpu}, "
                f"but the maximum number of adapters that can be hosted on CPU is {self.max_cpu_loras}."
            )

    # -- what the adapters say ----------------------------------------------------------
    def _extract_lora_config(self, lora_adapter_config: dict[str, Any] | None) -> tuple[list[str], int]:
        if lora_adapter_config is None:
            return [], self.max_lora_rank
        target_modules = lora_adapter_config["target_modules"]
        rank = lora_adapter_config["r"] if "r" in lora_adapter_config else lora_adapter_config["lora_rank"]
        return target_modules, rank

    def _extract_lora_config_from_folder(self, folder: str) -> tuple[list[str], int]:
        if "adapter_config.json" not in os.listdir(folder):
            raise FileNotFoundError(f"No LoRA configuration json file is found in {folder}")
        with open(os.path.join(folder, "adapter_config.json")) as handle:
            return self._extract_lora_config(json.load(handle))

    def _extract_lora_config_from_file(self, filename: str) -> tuple[list[str], int]:
        if filename.endswith(".safetensors"):
            state_dict: dict[str, Any] = load_file(filename)
        elif filename.endswith(".bin") or filename.endswith(".pt"):
            state_dict = torch.load(filename, weights_only=False)
        else:
            raise FileNotFoundError(f"Invalid checkpoint filename {filename} for LoRA adapter.")
        return self._extract_lora_config(state_dict.get("lora_config"))

    def get_lora_config_from_ckpt_paths(self) -> dict[str, Any]:
        if self.lora_ckpt_paths is None and self.lora_ckpt_paths_cpu is None:
            raise ValueError("No LoRA checkpoint paths are set.")
        if not self.dynamic_multi_lora and self.lora_ckpt_paths is None:
            logging.warning("No LoRA adapters will be loaded into device memory.")
        targets: set[str] = set()
        ranks = [self.max_lora_rank]
        for path in list(self.lora_ckpt_paths.values()) + list(self.lora_ckpt_paths_cpu.values()):
            if os.path.isdir(path):
                modules, rank = self._extract_lora_config_from_folder(path)
            else:
                modules, rank = self._extract_lora_config_from_file(path)
            targets.update(modules)
            ranks.append(rank)
        return {"target_modules": list(targets), "max_lora_rank": max(ranks)}
