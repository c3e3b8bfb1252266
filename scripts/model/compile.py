"""Compile the model for Inferentia2 ahead of time (`make compile`, on an inf2 host).

Loads the model the way a TorchServe worker does (handler/backends/neuronx.py or, with
`backend: nxdi`, handler/backends/nxdi.py; with the `handler:` and `scheduler:` sections of
model-config.yaml; an encoder config, `handler.task: embed`, traces every bucket of
handler.embed.buckets with torch_neuronx, handler/backends/encoder_neuron.py), so the artifacts and
their manifest land where the server looks: `<checkpoint>/neuron_cache/artifacts` by
default. The next start, and `make archive` (which ships the checkpoint folder), load them
without compiling. Run it again after changing tp_degree, amp, n_positions, buckets or
scheduler.n_slots: it recompiles only when the manifest no longer matches.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]

import yaml

from handler.backends.loader import nxdi_lora
from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.neuron.auto import DEVICE_BACKENDS


def device_backend(configured: str | None) -> str:
    """The device backend to compile for: the config's nxdi or neuronx; otherwise (hf, auto, sim)
    the one whose SDK is installed here, as `backend: auto` would pick it."""
    if configured in ("neuronx", "nxdi"):
        return configured
    installed = [name for name, package, _ in DEVICE_BACKENDS if importlib.util.find_spec(package)]
    return installed[0] if installed else "neuronx"


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the checkpoint (see make checkpoint)")
    parser.add_argument("--config", type=Path, default=REPO / "model-config.yaml")
    parser.add_argument("--no-warmup", action="store_true", help="skip the test generation per bucket")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    raw = yaml.safe_load(args.config.read_text()) or {}
    raw.setdefault("handler", {})
    raw["handler"]["model_checkpoint_dir"] = str(args.model_dir.resolve())
    embed = raw["handler"].get("task") == "embed"
    raw["handler"]["backend"] = "neuronx" if embed else device_backend(raw["handler"].get("backend"))
    if embed:
        from handler.backends.encoder_neuron import NeuronEncoder as DeviceBackend
    elif raw["handler"]["backend"] == "nxdi":
        from handler.backends.nxdi import NxdiBackend as DeviceBackend
    else:
        from handler.backends.neuronx import NeuronxBackend as DeviceBackend

    started = time.perf_counter()
    try:
        config = ServingConfig.from_model_yaml(raw)
        if raw["handler"]["backend"] == "nxdi":  # adapters and EAGLE draft compiled in (relative: beside the config)
            beside = args.config.resolve().parent
            speculation = config.handler.nxdi.speculation
            draft = speculation.draft_path(beside) if speculation is not None else None
            lora = nxdi_lora(config, beside)
            backend = DeviceBackend(config, args.model_dir.resolve(), gpu_id=None, workers=1, lora=lora, draft=draft)
        else:
            backend = DeviceBackend(config, args.model_dir.resolve(), gpu_id=None, workers=1)
    except ConfigError as exc:
        raise SystemExit(f"make compile: {exc}") from None
    try:
        if not args.no_warmup:
            backend.warmup()
        summary = (
            f"{'compiled' if backend.path_taken == 'compile' else 'already compiled, loaded'} in "
            f"{time.perf_counter() - started:.1f} s; artifacts: {backend.cache.artifacts_dir}"
        )
    finally:
        backend.close()
    print(summary, file=sys.stderr)
    return backend.path_taken


if __name__ == "__main__":
    main()
