"""Bare-backend reference: the backend in-process, no server, no HTTP.

For `sim` the reference is the profile itself (step at batch 1 and at the compiled batch
size); the simulated model is also run, to show how closely its sleeps follow the profile.
For `hf` it is the real `generate` of the configured checkpoint, measured at batch 1 and
at the micro-batch size, with fixed output lengths.

    python scripts/bench_backend.py --config build/bench/model-config.yaml --model-dir models/tiny-llama
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from handler.backends.base import Backend, RowSpec
from handler.backends.loader import load_backend
from handler.config import ServingConfig
from handler.protocol import SamplingParams


class TimingStreamer:
    """Records when each step's tokens arrive (the first put, the prompt, is skipped)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._saw_prompt = False

    def put(self, value: Any) -> None:
        if not self._saw_prompt:
            self._saw_prompt = True
            return
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def make_rows(backend: Backend, batch: int, prompt_tokens: int, output_tokens: int) -> list[RowSpec]:
    ids = backend.encode((REPO / "scripts" / "corpus.txt").read_text())
    rows = []
    for i in range(batch):
        prompt = [ids[(i * 7 + j) % len(ids)] for j in range(prompt_tokens)]
        rows.append(RowSpec(tuple(prompt), output_tokens, SamplingParams(), ignore_eos=True))
    return rows


def measure_generate(backend: Backend, batch: int, prompt_tokens: int, output_tokens: int, repeats: int):
    """Best of `repeats` runs: decode step (ms), first-token time (ms) and output tokens/s."""
    best: dict[str, float] | None = None
    for _ in range(repeats):
        rows = make_rows(backend, batch, prompt_tokens, output_tokens)
        streamer = TimingStreamer()
        started = time.perf_counter()
        backend.generate(rows, streamer, lambda i: False)
        wall = time.perf_counter() - started
        steps = len(streamer.times)
        run = {
            "batch": batch,
            "steps": steps,
            "first_token_ms": (streamer.times[0] - started) * 1000,
            "step_ms": (streamer.times[-1] - streamer.times[0]) * 1000 / max(1, steps - 1),
            "tokens_per_s": batch * steps / wall,
        }
        if best is None or run["tokens_per_s"] > best["tokens_per_s"]:
            best = run
    return best


def reference(config: dict[str, Any], model_dir: Path, prompt_tokens: int, output_tokens: int, repeats: int):
    serving = ServingConfig.from_model_yaml(config)
    backend = load_backend(serving, model_dir)
    backend.warmup()
    batch = backend.static_batch_size or serving.micro_batching.micro_batch_size
    out: dict[str, Any] = {"backend": backend.name, "batch_size": batch}
    if backend.name == "sim":
        profile = backend.profile
        out["profile"] = {
            "name": profile.name,
            "step_1_ms": profile.decode_s(1) * 1000,
            f"step_{batch}_ms": profile.decode_s(batch) * 1000,
            "prefill_1_ms": profile.prefill_s(1, prompt_tokens) * 1000,
            "ideal_tokens_per_s": profile.ideal_tokens_per_s(),
        }
        out["step_1_ms"] = out["profile"]["step_1_ms"]
        out["step_batch_ms"] = out["profile"][f"step_{batch}_ms"]
        out["ideal_tokens_per_s"] = profile.ideal_tokens_per_s()
    out["measured"] = {
        "batch_1": measure_generate(backend, 1, prompt_tokens, output_tokens, repeats),
        f"batch_{batch}": measure_generate(backend, batch, prompt_tokens, output_tokens, repeats),
    }
    if backend.name != "sim":
        out["step_1_ms"] = out["measured"]["batch_1"]["step_ms"]
        out["step_batch_ms"] = out["measured"][f"batch_{batch}"]["step_ms"]
        out["ideal_tokens_per_s"] = batch / (out["step_batch_ms"] / 1000)
    out["generate_tokens_per_s"] = out["measured"][f"batch_{batch}"]["tokens_per_s"]
    backend.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, required=True, help="a model-config.yaml")
    parser.add_argument("--model-dir", type=Path, required=True, help="where model_checkpoint_dir is relative to")
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    print(json.dumps(reference(config, args.model_dir, args.prompt_tokens, args.output_tokens, args.repeats), indent=1))


if __name__ == "__main__":
    main()
