"""Mirrors src/neuronx_distributed_inference/modules/lora_serving/lora_model.py (NxDI 0.8.16251, SDK
2.28 commit cd3abf3): the LoRA modules NxDI injects, the adapter caches of dynamic multi-LoRA and
LoraModelManager. Re-implemented; line numbers are the real file's.

- Injection (`LoraModel.inject_adapter`, 48-74; `_check_target_module_exists`, 97-118): a leaf module
  gets LoRA when its name is in target_modules, ends with ".<target>", or fully matches target_modules
  given as one regex string; target_modules None: ValueError "Target modules are not set for the base
  model."; no module matched: ValueError "Target modules [...] not found in the base model. Please check
  the target modules and try again." The fake's decoder has, per layer, `self_attn.{q,k,v,o}_proj` and
  `mlp.{gate,up,down}_proj` (`fake_lora_modules`); a target matching the embeddings or the LM head
  (which NxDI also supports) raises NotImplementedError here. Each LoRA module is two MultiLoraLinear
  (lora_layer.py:74-95, lora_module.py:85-102): lora_A (max_loras, in, max_lora_rank) and lora_B
  (max_loras, max_lora_rank, out) with lora_memory_transpose, plus (batch_size, ...) "active" rows.
- Adapter numbering (`get_adapter_id_mapping`, 440-446): the names of `ckpt_paths | ckpt_paths_cpu`, in
  order, are 0, 1, 2, ...: **index 0 is the first adapter**, not the base model.
- `convert_adapter_ids_to_indices(adapter_ids, batch_size)` (449-465): None gives zeros(batch_size)
  int32; more names than max_loras: ValueError "The number of LoRA adapter IDs is {n}, but the maximum
  number of adapters is {max_loras}." (it counts rows, so a batch wider than max_loras fails even with
  one adapter); a count other than batch_size: ValueError "... but it should equal the prompts number
  {batch_size}."; an unknown name: KeyError.
- Dynamic multi-LoRA (262-417, 503-554): AdapterCache (LRU by access time or LFU by count, halved every
  lfu_decay_period calls), one of capacity max_cpu_loras on the host and one of max_loras on the device.
  `dynamic_update_weights_for_lora(device_weights, adapter_ids)` runs before every context encoding
  (model_base.py:3388-3396): each index must be in the host cache (a bare `assert`: AssertionError,
  "NxDI does not support streaming adapters"), a device miss evicts (LRU/LFU) and copies the host
  weights into the freed position; it returns each row's device position.
- vLLM's API (556-590): add_adapter does nothing and returns True (no adapter can be added after
  start); remove_adapter(index) drops it from the host cache.
- Continuous batching (228-243): context encoding writes the rows' adapter weights into the active rows
  of their seq_ids and then indexes them by seq_id; token generation uses the active rows as they are,
  row i of the batch with active row i: the adapter_ids of a token-generation call select nothing.
  That part runs on the fake device (models/_device.py).
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from neuronx_distributed_inference.modules.lora_serving.config import LoraServingConfig
from neuronx_distributed_inference.modules.lora_serving.lora_checkpoint import LoraCheckpoint

logger = logging.getLogger("Neuron")

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class FakeLoraModule:
    """One MultiLoraLinear (lora_A or lora_B) of an injected module: its name in the state dict
    (`layers.0.self_attn.q_proj.lora_A`) and its stacked shapes."""

    name: str
    single_shape: tuple[int, int]
    max_loras: int
    max_loras_active: int
    dtype: torch.dtype = torch.float32

    def get_checkpoint_shape(self) -> tuple[int, ...]:
        return (self.max_loras, *self.single_shape)

    def get_checkpoint_shape_active(self) -> tuple[int, ...]:
        return (self.max_loras_active, *self.single_shape)

    def get_weight_dtype(self) -> torch.dtype:
        return self.dtype


def _target_matches(key: str, target_modules: Any) -> bool:
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, key) is not None
    return key in target_modules or any(key.endswith(f".{target}") for target in target_modules)


def fake_lora_modules(config: Any, lora_config: LoraServingConfig) -> list[FakeLoraModule]:
    """The LoRA modules `inject_adapter` would create in the fake's decoder (module docstring)."""
    if lora_config.target_modules is None:
        raise ValueError("Target modules are not set for the base model.")
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    intermediate = config.intermediate_size
    sizes = {
        "q_proj": (hidden, heads * head_dim),
        "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim),
        "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }
    for other in ("embed_tokens", "lm_head"):
        if _target_matches(other, lora_config.target_modules):
            raise NotImplementedError(f"fake NxD Inference: LoRA on {other} is not modelled")
    rank, transpose = lora_config.max_lora_rank, lora_config.lora_memory_transpose
    modules = []
    for layer in range(config.num_hidden_layers):
        for group, names in (("self_attn", _ATTENTION), ("mlp", _MLP)):
            for name in names:
                key = f"layers.{layer}.{group}.{name}"
                if not _target_matches(key, lora_config.target_modules):
                    continue
                in_features, out_features = sizes[name]
                a = (in_features, rank) if transpose else (rank, in_features)
                b = (rank, out_features) if transpose else (out_features, rank)
                for part, shape in (("lora_A", a), ("lora_B", b)):
                    module = FakeLoraModule(f"{key}.{part}", shape, lora_config.max_loras, lora_config.batch_size)
                    modules.append(module)
    if not modules:
        raise ValueError(
            f"Target modules {lora_config.target_modules} not found in the base model. "
            "Please check the target modules and try again."
        )
    return modules


class LoraWeightManager:
    """What wrap_model_with_lora returns (203-259): the model's LoraCheckpoint. The per-call tensor
    updates (update_lora_tensors) happen on the fake device."""

    def __init__(self, config: LoraServingConfig, base_model: Any = None) -> None:
        self.base_model = base_model
        self.lora_config = config
        self.lora_checkpoint = LoraCheckpoint(config)

    def update_lora_adapter_ids(self, adapter_ids: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
        return seq_ids


class AdapterCacheEntry:
    def __init__(self, position: int = 0) -> None:
        self.timestamp = 0.0
        self.access_count = 0
        self.weights: list[dict[str, torch.Tensor]] | None = None
        self.weight_idx = position
        self.in_use = False

    def init_weights_on_cpu(self, num_ranks: int) -> None:
        self.weights = [{} for _ in range(num_ranks)]

    def update_weights(self, rank: int, module: str, weight_tensor: torch.Tensor) -> None:
        assert self.weights is not None
        self.weights[rank][module] = weight_tensor

    def access(self) -> None:
        self.timestamp = time.monotonic()
        self.in_use = True
        self.access_count += 1

    def decay(self) -> None:
        self.access_count //= 2


class AdapterCache:
    def __init__(self, capacity: int, adapter_ids: list[int] | None = None, eviction_policy: str = "lru") -> None:
        self.size = 0
        self.capacity = capacity
        self.map: dict[int, AdapterCacheEntry] = {}
        self.eviction_policy = eviction_policy
        self.adapter_id_position_mapping = [-1] * capacity
        for idx, adapter_id in enumerate(adapter_ids or []):
            self.add_adapter(adapter_id, idx)

    def init_weights_on_cpu(
        self, adapter_ids: list[int], cpu_weights: list[dict[str, Any]], modules: list[str]
    ) -> None:
        for adapter_id in adapter_ids:
            self.map[adapter_id].init_weights_on_cpu(len(cpu_weights))
            for rank in range(len(cpu_weights)):
                for module in modules:
                    self.map[adapter_id].update_weights(rank, module, cpu_weights[rank][module][adapter_id])

    def update_adapter(self, adapter_id: int) -> None:
        assert adapter_id in self.map
        assert self.size == len(self.map)
        self.map[adapter_id].access()

    def access_adapter(self, adapter_id: int) -> bool:
        return adapter_id in self.map

    def add_adapter(self, adapter_id: int, position: int) -> None:
        self.map[adapter_id] = AdapterCacheEntry(position)
        self.adapter_id_position_mapping[position] = adapter_id
        self.size += 1

    def remove_adapter(self, adapter_id: int) -> None:
        del self.map[adapter_id]
        self.adapter_id_position_mapping[self.adapter_id_position_mapping.index(adapter_id)] = -1
        self.size -= 1

    def is_full(self) -> bool:
        return self.size == self.capacity

    def evict_adapter(self) -> tuple[int, int]:
        if self.eviction_policy == "lru":
            adapter_id, data = min(self.map.items(), key=lambda item: item[1].timestamp)
        elif self.eviction_policy == "lfu":
            adapter_id, data = min(self.map.items(), key=lambda item: item[1].access_count)
        else:
            raise ValueError(f"Invalid eviction policy {self.eviction_policy}.")
        self.remove_adapter(adapter_id)
        return adapter_id, data.weight_idx

    def decay_adapters(self) -> None:
        for entry in self.map.values():
            entry.decay()

    def swap_adapters(
        self, weights: list[dict[str, torch.Tensor]], modules: list[str], adapter_id: int, weight_idx: int
    ) -> None:
        cpu_weights = self.map[adapter_id].weights
        assert cpu_weights is not None
        for rank in range(len(weights)):
            for module in modules:
                weights[rank][module][weight_idx] = cpu_weights[rank][module].clone()

    def get_adapter_ids(self) -> list[int]:
        return list(self.map.keys())

    def get_adapter_id_position_mapping(self) -> list[int]:
        return self.adapter_id_position_mapping

    def get_adapter_id_positions(self, adapter_ids: Any) -> list[int]:
        return [self.adapter_id_position_mapping.index(adapter_id) for adapter_id in adapter_ids]

    def get_size(self) -> int:
        return self.size

    def get_swap_position(self) -> int:
        if not self.is_full():
            return self.adapter_id_position_mapping.index(-1)
        evicted, position = self.evict_adapter()
        logger.info(f"Adapter ID {evicted} is evicted from device HBM.")
        return position


class LoraModelManager:
    def __init__(self, config: LoraServingConfig) -> None:
        self.lora_config = config
        self.lora_checkpoint = LoraCheckpoint(config)
        self.req_ids_to_adapter_ids_mapping: dict[Any, Any] = {}
        self.lora_modules: list[str] = []
        self.get_adapter_id_mapping()
        cpu_ids = [self.lora_adapter_id_mapping[name] for name in self.lora_checkpoint.ckpt_paths_cpu]
        device_ids = [self.lora_adapter_id_mapping[name] for name in self.lora_checkpoint.ckpt_paths]
        self.cpu_adapter_cache = AdapterCache(config.max_cpu_loras, cpu_ids, config.eviction_policy)
        self.device_adapter_cache = AdapterCache(config.max_loras, device_ids, config.eviction_policy)
        self.decay_count = 0
        self.decay_max = config.lfu_decay_period

    def get_adapter_id_mapping(self) -> None:
        self.lora_adapter_id_mapping: dict[str, int] = {}
        all_paths = self.lora_checkpoint.ckpt_paths | self.lora_checkpoint.ckpt_paths_cpu
        for index, name in enumerate(all_paths):
            self.lora_adapter_id_mapping[name] = index

    def convert_adapter_ids_to_indices(self, adapter_ids: list[str] | None, batch_size: int) -> torch.Tensor:
        if adapter_ids is None:
            return torch.zeros((batch_size), dtype=torch.int32)
        if len(adapter_ids) > self.lora_config.max_loras:
            raise ValueError(
                f"The number of LoRA adapter IDs is {len(adapter_ids)}, "
                f"but the maximum number of adapters is {self.lora_config.max_loras}."
            )
        if len(adapter_ids) != batch_size:
            raise ValueError(
                f"The number of LoRA adapter IDs is {len(adapter_ids)}, "
                f"but it should equal the prompts number {batch_size}."
            )
        return torch.tensor([self.convert_adapter_id_to_index(name) for name in adapter_ids], dtype=torch.int32)

    def convert_adapter_id_to_index(self, adapter_id: str) -> int:
        return self.lora_adapter_id_mapping[adapter_id]

    # -- continuous batching bookkeeping (for vLLM; unused by a step-level caller) ------------
    def add_req_id_to_adapter_id_mapping(self, req_id: Any, adapter_id: Any) -> None:
        assert req_id not in self.req_ids_to_adapter_ids_mapping
        self.req_ids_to_adapter_ids_mapping[req_id] = adapter_id

    def update_req_ids_to_adapter_ids_mapping(self, cpu_adapter_ids: list[int], device_positions: list[int]) -> None:
        for cpu_id, position in zip(cpu_adapter_ids, device_positions, strict=False):
            for req_id, adapter_id in self.req_ids_to_adapter_ids_mapping.items():
                if adapter_id == cpu_id:
                    self.req_ids_to_adapter_ids_mapping[req_id] = position

    def remove_req_id(self, req_id: Any) -> None:
        del self.req_ids_to_adapter_ids_mapping[req_id]

    # -- dynamic multi-LoRA ----------------------------------------------------------------
    def init_dynamic_multi_lora(self, cpu_weights: list[dict[str, Any]]) -> None:
        if not cpu_weights:
            return
        for name in cpu_weights[0]:
            if self.lora_checkpoint.is_lora_module(name) and "weight_active" not in name:
                self.lora_modules.append(name)
        self.cpu_adapter_cache.init_weights_on_cpu(
            self.cpu_adapter_cache.get_adapter_ids(), cpu_weights, self.lora_modules
        )

    def dynamic_update_weights_for_lora(
        self, device_weights: list[dict[str, torch.Tensor]], adapter_ids: torch.Tensor
    ) -> torch.Tensor:
        for adapter_id in adapter_ids.tolist():
            # "NxDI does not support streaming adapters ... all adapters must be in CPU memory already" (521)
            assert self.cpu_adapter_cache.access_adapter(adapter_id)
            if self.device_adapter_cache.access_adapter(adapter_id):
                self.device_adapter_cache.update_adapter(adapter_id)
            else:
                position = self.device_adapter_cache.get_swap_position()
                logger.info(f"Swap Adapter ID {adapter_id} to position {position}.")
                self.cpu_adapter_cache.swap_adapters(device_weights, self.lora_modules, adapter_id, position)
                self.device_adapter_cache.add_adapter(adapter_id, position)
        if self.decay_count < self.decay_max:
            self.decay_count += 1
        else:
            self.cpu_adapter_cache.decay_adapters()
            self.device_adapter_cache.decay_adapters()
            self.decay_count = 0
        positions = self.device_adapter_cache.get_adapter_id_positions(adapter_ids.tolist())
        self.update_req_ids_to_adapter_ids_mapping(adapter_ids.tolist(), positions)
        return torch.tensor(positions, dtype=adapter_ids.dtype)

    # -- vLLM's LoRA API ---------------------------------------------------------------------
    def add_adapter(self, lora_request: Any) -> bool:
        return True

    def remove_adapter(self, adapter_id: int) -> bool:
        self.cpu_adapter_cache.remove_adapter(adapter_id)
        return True

    def pin_adapter(self, lora_id: int) -> bool:
        return True

    def list_adapters(self) -> set[str]:
        return set(self.lora_adapter_id_mapping)
