"""A PEFT LoRA adapter on disk, read and checked against the base model before anything loads it.

An adapter is a folder with `adapter_config.json` and `adapter_model.safetensors` (what
`PeftModel.save_pretrained` writes). It is refused at start, naming it, when a file is missing,
when its weights are not safetensors (`adapter_model.bin` is a pickle), when its rank is above the
configured limit, when it targets a module the base model lacks, or when its shapes do not fit the
base model (an adapter trained on another base: its `base_model_name_or_path` is often a hub id or a
path on another machine, so the shapes, not the name, decide).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from safetensors import safe_open

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PICKLED_WEIGHTS = ("adapter_model.bin", "adapter_model.pt")
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>[AB])(?:\.[^.]+)?\.weight$")


class AdapterError(ValueError):
    """An adapter that cannot be served; the message names it."""


@dataclass(frozen=True)
class AdapterSpec:
    name: str
    path: Path
    rank: int
    alpha: float
    target_modules: tuple[str, ...]  # the base model's module names it changes (q_proj, v_proj, ...)
    base_model: str  # as its adapter_config.json says (informative only)


def read_adapter(name: str, path: Path, max_rank: int, base_shapes: Mapping[str, tuple[int, int]]) -> AdapterSpec:
    """The adapter at `path`, checked against the base model's linear layers: `base_shapes` maps a
    module name (q_proj, ...) to its (in_features, out_features)."""
    if not path.is_dir():
        raise AdapterError(f"LoRA adapter {name!r}: {path} is not a folder")
    config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not weights_path.is_file():
        pickled = [p for p in PICKLED_WEIGHTS if (path / p).is_file()]
        if pickled:
            raise AdapterError(
                f"LoRA adapter {name!r}: {pickled[0]} is not safetensors; save it with safe_serialization=True "
                f"(only {WEIGHTS_FILE} is loaded)"
            )
        raise AdapterError(f"LoRA adapter {name!r}: {weights_path} is missing")
    if not config_path.is_file():
        raise AdapterError(f"LoRA adapter {name!r}: {config_path} is missing")
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"LoRA adapter {name!r}: {config_path} is not readable JSON ({exc})") from exc
    if str(config.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"LoRA adapter {name!r}: peft_type {config.get('peft_type')!r} is not LORA")
    for unsupported in ("use_dora", "modules_to_save"):
        if config.get(unsupported):
            raise AdapterError(f"LoRA adapter {name!r}: {unsupported} is not served")
    rank = int(config.get("r", 0))
    if not 0 < rank <= max_rank:
        raise AdapterError(f"LoRA adapter {name!r}: rank {rank} is above handler.lora.max_lora_rank ({max_rank})")
    targets = _check_weights(name, weights_path, rank, base_shapes)
    return AdapterSpec(
        name,
        path,
        rank,
        float(config.get("lora_alpha", rank)),
        targets,
        str(config.get("base_model_name_or_path") or ""),
    )


def _check_weights(
    name: str, weights_path: Path, rank: int, base_shapes: Mapping[str, tuple[int, int]]
) -> tuple[str, ...]:
    """The module names the weights target; each lora_A is [rank, in] and each lora_B [out, rank]
    for its base module's (in, out)."""
    targets: set[str] = set()
    with safe_open(str(weights_path), framework="pt") as weights:
        for key in weights.keys():
            match = _LORA_KEY.match(key)
            if match is None:
                continue
            module = match["module"].rsplit(".", 1)[-1]
            if module not in base_shapes:
                raise AdapterError(
                    f"LoRA adapter {name!r} targets {module!r}, which the base model lacks "
                    f"(it has {', '.join(sorted(base_shapes))})"
                )
            in_features, out_features = base_shapes[module]
            expected = [rank, in_features] if match["part"] == "A" else [out_features, rank]
            shape = list(weights.get_slice(key).get_shape())
            if shape != expected:
                raise AdapterError(
                    f"LoRA adapter {name!r} does not fit the base model: {key} is {shape}, the base model needs "
                    f"{expected} (an adapter trained on another base model?)"
                )
            targets.add(module)
    if not targets:
        raise AdapterError(f"LoRA adapter {name!r}: {weights_path.name} holds no LoRA weights")
    return tuple(sorted(targets))
