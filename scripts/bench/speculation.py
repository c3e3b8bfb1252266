"""`make bench-speculation` (also a stage of `make bench`): P16, prompt-lookup speculation (issue 45) on
the hf backend, in-process through the step engine.

The default model (SmolLM2-135M-Instruct, f32), `--streams` sequences at once (1 and 8: each a
stream of its own), greedy, for three workloads:
- P16a `json`: extract an email's details as JSON, the complaint copied word for word (long string
  values copied from the prompt);
- `rewrite`: rewrite a paragraph changing only the names (the small model copies part of it and
  summarises the rest);
- P16b `story`: an open-ended story (little to copy; speculation must not cost).

Each load runs without speculation and with k = `--k` proposed tokens a row, back-off on and off
(`scheduler.speculation.backoff`). Per run: output tokens, engine steps, tok/s, the ratio to k = 0,
the acceptance rate (accepted / proposed tokens), and tokens per row per step. The texts must be
those of k = 0 (the script stops if not: speculation is exact). Prints a table; writes
bench_results/bench-speculation.json.

    python -m scripts.bench.speculation --model-dir models/smollm2-135m-instruct

A measurement, not a test: one run's figures on a shared host; the loads run in turn, k = 0 first.
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
from handler.engine.speculation import Speculator
from handler.engine.step_engine import StepEngine
from handler.request import GenerationRequest

PARAGRAPH = (
    "Maria Lopez founded the bakery on Elm Street in 1998 with her brother Daniel. Every morning at five, "
    "Maria lit the ovens while Daniel sorted the flour deliveries and checked the orders from the cafes "
    "downtown. Their sourdough became famous after a food critic, Helen Park, wrote that it was the best "
    "bread in the city. When Daniel moved to Portland in 2010, Maria hired her neighbor, Samuel Greene, who "
    "had never baked before but learned quickly. Today Maria and Samuel run two shops, and Helen Park still "
    "buys a loaf every Saturday."
)
EMAIL = (
    "Hello, my name is Jonathan Whitaker and my email is jon.whitaker@example.com. I am writing about order number "
    "48213-77. The blue ceramic teapot I ordered arrived with a cracked lid and a chipped spout, and the box was "
    "soaked through as if it had been left out in the rain for hours. I would like a replacement sent as soon as "
    "possible."
)
WORKLOADS = {
    "json": "Extract the customer's details from this email as JSON with the keys name, email, order_number and "
    f"complaint (the complaint copied word for word from the email).\n\nEmail:\n{EMAIL}",
    "rewrite": f"Rewrite this paragraph, changing only the names of the people:\n\n{PARAGRAPH}",
    "story": "Write a story about a lighthouse keeper who finds a message in a bottle.",
}
VARIANTS = (("off", 0, False), ("k", None, False), ("k+backoff", None, True))  # (label, k or the --k, backoff)


def run(
    model_dir: Path,
    prompt: str,
    k: int,
    backoff: bool,
    streams: int,
    max_tokens: int,
    threads: int,
    lookup: tuple[int, int],
) -> dict:
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(model_dir), cpu_threads=threads), model_dir, streams, k)
    try:
        speculator = Speculator(NgramProposer(k, *lookup), backoff) if k else None
        engine = StepEngine(backend, 100_000, speculator=speculator)
        text = backend.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        ids = backend.encode(text, add_special_tokens=False)
        sequences = [
            Sequence(GenerationRequest(text, max_tokens), list(ids), backend.tokenizer, backend.eos_token_ids, f"r{i}")
            for i in range(streams)
        ]
        for sequence in sequences:
            engine.submit(sequence)
        started, steps = time.perf_counter(), 0
        while not all(s.finished for s in sequences):
            engine.step()
            steps += 1
        seconds = time.perf_counter() - started
        records = engine.take_records()
    finally:
        backend.close()
    tokens = sum(s.completion_tokens for s in sequences)
    proposed = sum(r.proposed_tokens for r in records)
    accepted = sum(r.accepted_tokens for r in records)
    rows = sum(r.decoded for r in records)
    return {
        "k": k,
        "backoff": backoff,
        "tokens": tokens,
        "steps": steps,
        "seconds": seconds,
        "tok_s": tokens / seconds,
        "proposed": proposed,
        "accepted": accepted,
        "acceptance": accepted / proposed if proposed else None,
        "tokens_per_row_step": sum(r.decoded_tokens for r in records) / rows if rows else None,
        "text": sequences[0].full_text,
    }


def measure(args: argparse.Namespace, name: str, streams: int) -> list[dict]:
    """Every variant of one load, `--repeats` rounds, each round in a rotated order (so drift on a
    shared host falls on every variant alike); per variant the median round's figures."""
    rounds: dict[str, list[dict]] = {label: [] for label, _, _ in VARIANTS}
    for round_ in range(args.repeats):
        order = VARIANTS[round_ % len(VARIANTS) :] + VARIANTS[: round_ % len(VARIANTS)]
        for label, k, backoff in order:
            k = args.k if k is None else k
            lookup = tuple(args.lookup)
            result = run(
                args.model_dir, WORKLOADS[name], k, backoff, streams, args.max_tokens, args.cpu_threads, lookup
            )
            rounds[label].append(result)
    texts = {r["text"] for runs in rounds.values() for r in runs}
    if len(texts) != 1:
        raise SystemExit(f"{name}, {streams} streams: the texts differ between runs; speculation must be exact")
    medians = {label: sorted(runs, key=_tok_s)[(len(runs) - 1) // 2] for label, runs in rounds.items()}  # median (low)
    off = _tok_s(medians["off"])
    out = []
    for label, result in medians.items():
        result = {**result, "load": name, "streams": streams, "run": label, "vs_off": _tok_s(result) / off}
        result["tok_s_rounds"] = [round(_tok_s(r), 2) for r in rounds[label]]
        accept = "-" if result["acceptance"] is None else f"{result['acceptance']:.2f}"
        print(
            f"{name:>9} {streams:>7} {label:>10} {result['tokens']:>6} {result['steps']:>5} "
            f"{result['tok_s']:>7.1f} {result['vs_off']:>6.2f} {accept:>6} {result['tokens_per_row_step']:>12.2f}  "
            f"{result['tok_s_rounds']}"
        )
        out.append(result)
    return out


def _tok_s(result: dict) -> float:
    return float(result["tok_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--cpu-threads", type=int, default=2)
    parser.add_argument("--lookup", type=int, nargs=2, default=[2, 4], metavar=("MIN", "MAX"))
    parser.add_argument("--loads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every run, in turn; medians reported")
    parser.add_argument("--out", type=Path, default=Path("bench_results/bench-speculation.json"))
    args = parser.parse_args(argv)
    results: list[dict] = []
    print(
        f"{'load':>9} {'streams':>7} {'run':>10} {'tokens':>6} {'steps':>5} {'tok/s':>7} {'vs off':>6} "
        f"{'accept':>6} {'tok/row/step':>12}  tok/s by round"
    )
    for name in args.loads:
        for streams in args.streams:
            results += measure(args, name, streams)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {
        "k": args.k,
        "lookup": args.lookup,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "cpu_threads": args.cpu_threads,
        "cores": os.cpu_count(),
    }
    args.out.write_text(json.dumps({"settings": settings, "loadavg": os.getloadavg(), "results": results}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
