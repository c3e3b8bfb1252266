"""Host cost of one step's token handling other than sampling: `Sequence.take` per row, i.e.
incremental detokenizing and stop-string matching, measured at a given number of tokens
generated so far. It must not grow with that number: each token should cost the same at
token 2048 as at token 64, or the host falls behind the device on long generations.
`--stream` picks what the rows generate: ordinary text (the corpus), or a degenerate loop
a small model can fall into: one lone UTF-8 byte token over and over (the text always ends
in U+FFFD, so it is held back), or one special token (decodes to nothing).

    python -m scripts.bench.detokenize --rows 32 --lengths 64 512 2048 [--stream bytes]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

from handler.engine.sequence import Sequence
from handler.request import GenerationRequest, TokenChoice

WINDOW = 32  # steps timed just before each length; their median is that length's step time
PROMPT_TOKENS = 128


def text_token_ids(tokenizer: Any, stop: Seq[str]) -> list[int]:
    """Ordinary text tokens (the corpus), with the stop strings' characters taken out so no row stops."""
    text = (REPO / "scripts" / "model" / "corpus.txt").read_text()
    for s in stop:
        for ch in set(s.strip()):
            text = text.replace(ch, "")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = set(tokenizer.all_special_ids)
    return [i for i in ids if i not in special]


def stream_token_ids(tokenizer: Any, stream: str, stop: Seq[str]) -> list[int]:
    """The token ids rows cycle through: corpus text, or one token repeated (see the module doc)."""
    if stream == "text":
        return text_token_ids(tokenizer, stop)
    if stream == "special":
        specials = [i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id]
        return [specials[0] if specials else tokenizer.eos_token_id]
    if stream == "bytes":
        for i in range(len(tokenizer)):
            if tokenizer.decode([i] * 8, skip_special_tokens=True) == "\ufffd" * 8:
                return [i]
        raise RuntimeError("the tokenizer has no lone-byte token")
    raise ValueError(f"unknown stream {stream!r}")


def one_pass(tokenizer: Any, ids: list[int], rows: int, total: int, stop: tuple[str, ...]) -> list[float]:
    """Seconds of each step (one `take` per row) from token 1 to `total`."""
    sequences = []
    for row in range(rows):
        prompt_ids = [ids[(row * 7 + j) % len(ids)] for j in range(PROMPT_TOKENS)]
        request = GenerationRequest(prompt="", max_new_tokens=total + 1, stop=stop, ignore_eos=True)
        sequences.append(Sequence(request, prompt_ids, tokenizer, frozenset({tokenizer.eos_token_id})))
    streams = [[TokenChoice(ids[(row * 13 + n) % len(ids)]) for n in range(total)] for row in range(rows)]
    steps = []
    for n in range(total):
        start = time.perf_counter()
        for sequence, stream in zip(sequences, streams, strict=True):
            sequence.take(stream[n])
        steps.append(time.perf_counter() - start)
    if any(sequence.finished for sequence in sequences):
        raise RuntimeError("a row finished early (stop string in the token stream?); the timings would be off")
    return steps


def measure_detokenize(
    tokenizer: Any,
    rows: int = 32,
    lengths: Seq[int] = (64, 512, 2048),
    stop: tuple[str, ...] = ("###", "\n\nUser:"),
    repeats: int = 5,
    stream: str = "text",
) -> list[dict]:
    """Step time at `rows` rows around each length: median of the `WINDOW` steps up to it, best of `repeats`."""
    stop = tuple(stop)
    ids = stream_token_ids(tokenizer, stream, stop)
    lengths = sorted(lengths)
    best: dict[int, float] = {}
    for _ in range(repeats):
        steps = one_pass(tokenizer, ids, rows, lengths[-1], stop)
        for length in lengths:
            median = statistics.median(steps[max(0, length - WINDOW) : length])
            best[length] = min(best.get(length, median), median)
    return [
        {"rows": rows, "tokens_so_far": n, "step_ms": best[n] * 1e3, "per_row_us": best[n] * 1e6 / rows}
        for n in lengths
    ]


def main() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    from handler.backends.tokenizer import load_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama")
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--lengths", type=int, nargs="+", default=[64, 512, 2048])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stream", choices=("text", "bytes", "special"), default="text")
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model_dir, trust_remote_code=False)
    results = measure_detokenize(tokenizer, args.rows, args.lengths, repeats=args.repeats, stream=args.stream)
    print(f"{'rows':>5} {'tokens_so_far':>14} {'step_ms':>9} {'per_row_us':>11}")
    for r in results:
        print(f"{r['rows']:>5} {r['tokens_so_far']:>14} {r['step_ms']:>9.3f} {r['per_row_us']:>11.2f}")
    ratio = results[-1]["step_ms"] / results[0]["step_ms"]
    grows = ratio > 1.5
    print(
        f"verdict: step time at {results[-1]['tokens_so_far']} tokens is {ratio:.2f}x that at "
        f"{results[0]['tokens_so_far']}: {'GROWS with length' if grows else 'flat (does not grow with length)'}"
    )


if __name__ == "__main__":
    main()
