"""LoRA adapters on Inferentia2, SDK-free: what the nxdi backend needs to serve them with NxD
Inference's multi-LoRA (`neuronx_distributed_inference.modules.lora_serving`, SDK 2.27+), in plain
values. Imports no config: the backend is handed a `LoraSettings`.

How NxDI numbers adapters (read at the SDK 2.28 release commit cd3abf3, NxDI 0.8.16251):
- `LoraModelManager.get_adapter_id_mapping` (lora_model.py:440-446) numbers the adapters of
  `lora_ckpt_paths | lora_ckpt_paths_cpu` by position, **from 0**, and `LoraCheckpoint._load_lora_weights`
  (lora_checkpoint.py:199-217) puts adapter i's weights in slot i of every LoRA weight stack. At 2.27 and
  2.28 no index means "the base model": a row always runs with some adapter. (SDK 2.26, NxDI 0.6, kept
  index 0 as an all-zero adapter, lora_checkpoint.py:246-252 at v0.6.10598; SDK 2.29 brings that back
  as `enable_base_model_only`, lora_serving/config.py at c63afe0.)
- So the backend registers an all-zero adapter of its own first (`write_base_adapter`, named
  `BASE_ADAPTER`): index 0 is the base model, the i-th adapter of `LoraSettings.adapters` is index i,
  on every SDK from 2.27 on.
- The index tensor is built here (`AdapterIndex`), never with `convert_adapter_ids_to_indices`
  (lora_model.py:449-465), which refuses a call with more rows than `max_loras` ("The number of LoRA
  adapter IDs is N, but the maximum number of adapters is M"): it counts rows, not distinct adapters.

What the compiled artifacts depend on: each adapter's files by size and SHA-256
(`adapter_identity`), the same rule as the checkpoint's (handler/neuron/checkpoint_identity.py): with
`save_sharded_checkpoint` NxD bakes the adapters' weights into the pre-sharded weights
(neuronx_distributed trace/trace.py:637-638 at v2.28.0, `preprocess_checkpoint`), so a changed adapter
file must recompile, or be refused, never be served stale.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.neuron.checkpoint_identity import file_sha256, stat_of

BASE_ADAPTER = "__base__"  # the backend's own all-zero adapter at index 0 (a configured name may not be this)
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
BASE_RANK = 2  # the base adapter's rank (the smallest NxDI loads: see `nxdi_rank_refusal`)
STATS_KEY = "lora_stats"  # the manifest's entry for the adapter files' size and mtime (not compared)
# The checkpoints NxDI's multi-LoRA serves with these shapes (the SDK 2.28 feature guide's families:
# Llama-2/3.x, TinyLlama, OpenLLaMA, Qwen2, Qwen3; Mistral runs as NeuronLlamaForCausalLM at 2.28).
LORA_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """What a backend takes from `handler.lora`.

    `adapters`: (name, folder) in order; the i-th is device index i (0 is the base model).
    `max_loras`: distinct adapters in one step (the scheduler's limit). On nxdi without dynamic
    multi-LoRA every adapter is compiled into device memory whatever it says (NxDI raises max_loras to
    the number of checkpoints, lora_serving/config.py:151-153); with it (`handler.nxdi.dynamic_multi_lora`)
    it is the number of adapters held in device memory besides the base, the rest in host memory.
    `max_lora_rank`: the highest rank served (NxDI pads every adapter to it)."""

    adapters: tuple[tuple[str, Path], ...]
    max_loras: int
    max_lora_rank: int

    def __post_init__(self) -> None:
        names = [name for name, _ in self.adapters]
        if not names:
            raise ValueError("LoraSettings: no adapters")
        if len(set(names)) != len(names):
            raise ValueError(f"LoraSettings: an adapter name appears twice in {names}")
        if BASE_ADAPTER in names:
            raise ValueError(f"LoraSettings: the adapter name {BASE_ADAPTER!r} is reserved for the base model")
        if self.max_loras < 1 or self.max_lora_rank < 1:
            raise ValueError("LoraSettings: max_loras and max_lora_rank must be >= 1")

    @classmethod
    def of(cls, adapters: Mapping[str, str | Path], max_loras: int, max_lora_rank: int) -> LoraSettings:
        """From `handler.lora.adapters` (name -> folder, in the YAML's order)."""
        return cls(tuple((name, Path(path)) for name, path in adapters.items()), max_loras, max_lora_rank)


def _field(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def llama_lora_shapes(config: Any) -> dict[str, tuple[int, int]] | None:
    """The linear layers of a Llama-family decoder an adapter may target, module name -> (in_features,
    out_features), from its config.json (a mapping or a transformers config); None when a size is missing.
    Attention: q (hidden -> heads x head_dim), k and v (hidden -> kv_heads x head_dim), o (back to hidden);
    MLP: gate and up (hidden -> intermediate), down (intermediate -> hidden)."""
    sizes = ("hidden_size", "num_attention_heads", "intermediate_size")
    hidden, heads, intermediate = (_field(config, key) for key in sizes)
    if not (isinstance(hidden, int) and isinstance(heads, int) and isinstance(intermediate, int)) or heads < 1:
        return None
    kv_heads = _field(config, "num_key_value_heads") or heads
    head_dim = _field(config, "head_dim") or hidden // heads
    q_out, kv_out = heads * head_dim, kv_heads * head_dim
    return {
        "q_proj": (hidden, q_out),
        "k_proj": (hidden, kv_out),
        "v_proj": (hidden, kv_out),
        "o_proj": (q_out, hidden),
        "gate_proj": (hidden, intermediate),
        "up_proj": (hidden, intermediate),
        "down_proj": (intermediate, hidden),
    }


def read_config_json(checkpoint: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_base_adapter(folder: Path, shapes: Mapping[str, tuple[int, int]], target_modules: Sequence[str]) -> Path:
    """The all-zero adapter that is index 0 (the base model), as a PEFT folder NxDI reads
    (adapter_config.json + safetensors): rank 2 (NxDI squeezes each LoRA tensor, so rank 1 would fail:
    `nxdi_rank_refusal`), the adapters' target modules (so NxDI's union of
    target modules and its max rank, lora_serving/config.py:58-73, are what the real adapters make
    them), zero lora_A / lora_B for layer 0 only (every other LoRA weight NxDI initialises with zeros,
    lora_checkpoint.py:262-268). Written the same way every time."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = {
        "peft_type": "LORA",
        "r": BASE_RANK,
        "lora_alpha": BASE_RANK,
        "target_modules": sorted(target_modules),
        "bias": "none",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "",
        "inference_mode": True,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    weights = {}
    for module in sorted(target_modules):
        in_features, out_features = shapes[module]
        group = "self_attn" if module in ATTENTION else "mlp"
        prefix = f"base_model.model.model.layers.0.{group}.{module}"
        weights[f"{prefix}.lora_A.weight"] = torch.zeros(BASE_RANK, in_features)
        weights[f"{prefix}.lora_B.weight"] = torch.zeros(out_features, BASE_RANK)
    save_file(weights, str(folder / "adapter_model.safetensors"))
    return folder


def nxdi_rank_refusal(name: str, rank: int) -> str | None:
    """Why NxDI 0.8 cannot load an adapter of this rank, or None. `LoraCheckpoint` squeezes every
    LoRA tensor before padding it into its slot (lora_checkpoint.py:183, 186 at cd3abf3): at rank 1,
    lora_A (1, in) becomes 1-D and `lora_weight[: shape[0], : shape[1]]` (214-216) raises IndexError."""
    if rank >= BASE_RANK:
        return None
    return (
        f"LoRA adapter {name!r} has rank {rank}: NxD Inference cannot load a rank-1 adapter (it squeezes each "
        "LoRA tensor to 1-D, lora_checkpoint.py); serve it with backend hf, or retrain it with r >= 2"
    )


def adapter_identity(folder: Path, known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity, stats) of an adapter folder's two files: identity is each file's size and SHA-256
    (what the artifacts depend on), stats its size and mtime. `known` ({"identity", "stats"}, what a
    manifest recorded) lets a file whose stat is unchanged keep its digest unread."""
    recorded = (known or {}).get("identity", {})
    recorded_stats = (known or {}).get("stats", {})
    identity: dict[str, Any] = {}
    stats: dict[str, Any] = {}
    for name in ADAPTER_FILES:
        path = folder / name
        stat = stat_of(path)
        stats[name] = stat
        previous = recorded.get(name)
        if previous is not None and recorded_stats.get(name) == stat and previous.get("size") == stat["size"]:
            identity[name] = previous
        else:
            identity[name] = {"size": stat["size"], "sha256": file_sha256(path)}
    return identity, stats


@dataclass(frozen=True)
class NxdiLoraLayout:
    """The LoraServingConfig keywords for a set of adapters, and the names by device index."""

    keywords: dict[str, Any]  # LoraServingConfig(**keywords), paths included
    names: tuple[str, ...]  # index -> name; names[0] is BASE_ADAPTER

    @classmethod
    def build(
        cls,
        settings: LoraSettings,
        dynamic: bool,
        ranks: Sequence[int],
        targets: Sequence[str],
        base: Path,
        n_slots: int,
    ) -> NxdiLoraLayout:
        """`dynamic`: NxDI's dynamic_multi_lora; `ranks` and `targets`: the adapters' (read and checked
        before); `base`: the base adapter's folder; `n_slots`: the compiled batch.

        NxDI keeps one row of "active" LoRA weights per sequence slot (`batch_size`, lora_module.py:30),
        written at the slot's context encoding (lora_layer.py:47-55) and read row by row in token
        generation (lora_layer.py:57-63): it must be the number of slots. Its default, 1, gives every
        slot the adapter of the last prefill (a seq_id past the rows is clamped to row 0)."""
        names = (BASE_ADAPTER, *(name for name, _ in settings.adapters))
        paths = {BASE_ADAPTER: str(base), **{name: str(path) for name, path in settings.adapters}}
        keywords: dict[str, Any] = {
            "max_lora_rank": max(settings.max_lora_rank, *ranks),
            "batch_size": n_slots,
            "target_modules": sorted(set(targets)),
            "dynamic_multi_lora": dynamic,
        }
        if dynamic:
            # device memory: the base and the first max_loras adapters; host memory: all of them, in the
            # same order, so that NxDI's index of an adapter (its position in lora_ckpt_paths followed by
            # the host-only ones, lora_model.py:440-446) is also its row in the host weights (lora_model.py:
            # 318-325 reads them by that index).
            device = names[: settings.max_loras + 1]
            keywords |= {
                "max_loras": settings.max_loras + 1,
                "max_cpu_loras": len(names),
                "lora_ckpt_paths": {name: paths[name] for name in device},
                "lora_ckpt_paths_cpu": dict(paths),
            }
        else:
            keywords |= {"max_loras": len(names), "lora_ckpt_paths": dict(paths)}
        return cls(keywords, names)

    def manifest(self, identities: Mapping[str, Any]) -> dict[str, Any]:
        """What the artifacts depend on: the keywords without the folders' paths (an adapter moved with
        its content unchanged needs no recompile), the order, and each adapter's files."""
        keywords = {k: v for k, v in self.keywords.items() if k not in ("lora_ckpt_paths", "lora_ckpt_paths_cpu")}
        keywords["device_adapters"] = list(self.keywords["lora_ckpt_paths"])
        # by name, so that a mismatch names the adapter and its file (lora.adapters.<name>.<file>.sha256)
        return {"nxdi": keywords, "order": list(self.names), "adapters": {n: identities[n] for n in self.names[1:]}}


class AdapterIndex:
    """Adapter name -> device index (None, the base model, is 0), and each row's index tensor values."""

    def __init__(self, names: Sequence[str]) -> None:
        self._index = {name: i for i, name in enumerate(names) if i > 0}

    def __contains__(self, name: object) -> bool:
        return name in self._index

    def index(self, name: str | None) -> int:
        """KeyError for a name not served."""
        return 0 if name is None else self._index[name]

    def forget(self, name: str) -> int:
        return self._index.pop(name)
