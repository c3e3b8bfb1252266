"""Model configs for the two scheduling modes, from one base config."""

from __future__ import annotations

from typing import Any

MODES = ("continuous", "static")


def with_mode(config: dict[str, Any], mode: str, n_slots: int = 4) -> dict[str, Any]:
    """`config` served in `mode`: continuous (TorchServe continuousBatching, the shipped
    default) or static (TorchServe batching + micro_batching, micro_batch_size slots)."""
    out = {k: v for k, v in config.items() if k not in ("continuousBatching", "scheduler")}
    if mode == "continuous":
        out.update(continuousBatching=True, batchSize=2 * n_slots, maxBatchDelay=1)
        out["scheduler"] = {"mode": "continuous", "n_slots": n_slots}
    elif mode == "static":
        micro = out.setdefault("micro_batching", {"micro_batch_size": n_slots})
        out["scheduler"] = {"mode": "static", "n_slots": micro["micro_batch_size"]}
    else:
        raise ValueError(f"unknown mode {mode!r}")
    return out


def tiny_model_yaml(model_dir: Any, mode: str, n_slots: int) -> dict[str, Any]:
    """The tiny model (n_positions 128) served in `mode` with `n_slots`; static mode runs one
    micro-batch of n_slots with one thread per stage."""
    base: dict[str, Any] = {
        "batchSize": 2 * n_slots,
        "handler": {"model_checkpoint_dir": str(model_dir), "n_positions": 128, "max_new_tokens": 100},
    }
    if mode == "static":
        base["micro_batching"] = {
            "micro_batch_size": n_slots,
            "parallelism": {"preprocess": 1, "inference": 1, "postprocess": 1},
        }
    return with_mode(base, mode, n_slots)
