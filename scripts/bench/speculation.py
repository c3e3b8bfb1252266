"""`make bench-speculation`: prompt-lookup speculation (issue 45) on the hf backend, in-process.

The default model (SmolLM2-135M-Instruct, f32), `--rows` greedy sequences at once through the
step engine, for two prompts: one whose answer copies its input (repeat a paragraph) and one that
copies nothing (a poem). For each, without speculation and with k = `--k` proposed tokens a row:
output tokens, engine steps, wall time, tok/s, and the ratio to k = 0. The texts must be the same
(the script stops if not: speculation is exact). Prints a table; writes bench_results/bench-speculation.json.

    python -m scripts.bench.speculation --model-dir models/smollm2-135m-instruct

A measurement, not a test: one run's figures on a shared host.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.engine.ngram import NgramProposer
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine
from handler.request import GenerationRequest

PARAGRAPH = (
    "Inferentia2 is a machine learning accelerator designed by AWS. Each chip has two NeuronCores, 32 GB of "
    "high-bandwidth memory and supports BF16, FP16 and FP8. Instances range from inf2.xlarge with one chip to "
    "inf2.48xlarge with twelve chips."
)
PROMPTS = {
    "copy": f"Repeat this text exactly:\n{PARAGRAPH}",
    "free": "Write a short poem about the sea.",
}


def run(model_dir: Path, prompt: str, k: int, rows: int, max_tokens: int, threads: int) -> dict[str, object]:
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(model_dir), cpu_threads=threads), model_dir, rows, k)
    try:
        engine = StepEngine(backend, 100_000, proposer=NgramProposer(k, 1, 4) if k else None)
        text = backend.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = backend.encode(text, add_special_tokens=False)
        sequences = [
            Sequence(GenerationRequest(text, max_tokens), list(ids), backend.tokenizer, backend.eos_token_ids, f"r{i}")
            for i in range(rows)
        ]
        for sequence in sequences:
            engine.submit(sequence)
        started, steps = time.perf_counter(), 0
        while not all(s.finished for s in sequences):
            engine.step()
            steps += 1
        seconds = time.perf_counter() - started
    finally:
        backend.close()
    tokens = sum(s.completion_tokens for s in sequences)
    return {
        "k": k,
        "tokens": tokens,
        "steps": steps,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "text": sequences[0].full_text,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--k", type=int, nargs="+", default=[3, 5])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("bench_results/bench-speculation.json"))
    args = parser.parse_args(argv)
    results: dict[str, list[dict[str, object]]] = {}
    print(f"{'prompt':6} {'k':>2} {'tokens':>6} {'steps':>5} {'s':>7} {'tok/s':>7} {'vs k=0':>7}")
    for name, prompt in PROMPTS.items():
        runs = [run(args.model_dir, prompt, k, args.rows, args.max_tokens, args.cpu_threads) for k in [0, *args.k]]
        base = runs[0]
        for result in runs:
            if result["text"] != base["text"]:
                raise SystemExit(f"{name}, k={result['k']}: the text differs from k=0's; speculation must be exact")
            result["vs_k0"] = float(result["tok_s"]) / float(base["tok_s"])  # type: ignore[arg-type]
            print(
                f"{name:6} {result['k']:>2} {result['tokens']:>6} {result['steps']:>5} {result['seconds']:>7.2f} "
                f"{result['tok_s']:>7.1f} {result['vs_k0']:>7.2f}"
            )
        results[name] = runs
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "rows": args.rows,
        "max_tokens": args.max_tokens,
        "cpu_threads": args.cpu_threads,
        "cores": os.cpu_count(),
    }
    args.out.write_text(json.dumps({"settings": settings, "loadavg": os.getloadavg(), "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
