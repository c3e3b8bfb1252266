"""Where a replica's tokens become text: the worker's host time per step round for R replicas x
B rows, in the two places detokenizing could run.

- `in the replica` (what handler/replicas/ does): each replica runs its sequences' `Sequence`
  (detokenizer, stop strings, end checks) and sends each one's `Progress`; the worker
  unpickles the `Stepped` message and `adopt`s it.
- `in the worker`: each replica would send only its `TokenChoice`s; the worker unpickles them
  and runs `Sequence.take` on every row itself.

The worker is one process for all replicas (and TorchServe's I/O), so its share per step
round is what could fall behind R devices; the replicas' own time runs in parallel. Tokens
are the corpus's, through the tiny model's tokenizer, with two stop strings per request.

    python -m scripts.bench.replica_messages --replicas 3 --rows 32
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

from handler.backends.tokenizer import load_tokenizer
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepRecord
from handler.replicas.protocol import Stepped
from handler.request import GenerationRequest, TokenChoice
from scripts.bench.detokenize import text_token_ids

STOP = ("\n\n\n", "###")
PROMPT = list(range(100, 228))


def sequences(tokenizer, rows: int) -> list[Sequence]:
    request = GenerationRequest("p", 100_000, stop=STOP, ignore_eos=True)
    return [Sequence(request, PROMPT, tokenizer, frozenset(), f"r{i}") for i in range(rows)]


def measure(tokenizer, ids: list[int], replicas: int, rows: int, steps: int) -> dict[str, float]:
    """Median worker seconds per step round, each way."""
    in_replica = [sequences(tokenizer, rows) for _ in range(replicas)]  # the replicas' own copies
    adopting = [sequences(tokenizer, rows) for _ in range(replicas)]  # the worker's copies, way 1
    taking = [sequences(tokenizer, rows) for _ in range(replicas)]  # the worker's copies, way 2
    record = StepRecord(None, 0.05, 0, rows, rows, 0)
    adopt_s, take_s, replica_s = [], [], []
    for step in range(steps):
        messages_adopt, messages_take = [], []
        started = time.perf_counter()
        for r in range(replicas):
            choices = [TokenChoice(ids[(step * 7 + r * 131 + i * 17) % len(ids)]) for i in range(rows)]
            for sequence, choice in zip(in_replica[r], choices, strict=True):
                sequence.take(choice)
            progress = tuple(s.progress_since(len(s.token_ids) - 1) for s in in_replica[r])
            messages_adopt.append(pickle.dumps(Stepped(progress, (record,), rows, 0)))
            messages_take.append(pickle.dumps((tuple(choices), (record,), rows, 0)))
        replica_s.append((time.perf_counter() - started) / replicas)  # per replica, in parallel on a device host

        started = time.perf_counter()
        for r, blob in enumerate(messages_adopt):
            for sequence, progress in zip(adopting[r], pickle.loads(blob).progress, strict=True):
                sequence.adopt(progress)
        adopt_s.append(time.perf_counter() - started)

        started = time.perf_counter()
        for r, blob in enumerate(messages_take):
            for sequence, choice in zip(taking[r], pickle.loads(blob)[0], strict=True):
                sequence.take(choice)
        take_s.append(time.perf_counter() - started)
    return {
        "worker_in_replica_ms": statistics.median(adopt_s) * 1000,
        "worker_in_worker_ms": statistics.median(take_s) * 1000,
        "replica_detokenize_ms": statistics.median(replica_s) * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--rows", type=int, default=32, help="sequences per replica (its n_slots)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama")
    args = parser.parse_args(argv)
    tokenizer = load_tokenizer(args.model_dir, False)
    ids = text_token_ids(tokenizer, STOP)
    result = measure(tokenizer, ids, args.replicas, args.rows, args.steps)
    print(f"{args.replicas} replicas x {args.rows} rows, median of {args.steps} step rounds:")
    print(f"  worker, detokenizing in the replicas (adopt Progress):  {result['worker_in_replica_ms']:.2f} ms")
    print(f"  worker, detokenizing in the worker (Sequence.take):     {result['worker_in_worker_ms']:.2f} ms")
    print(f"  each replica's own detokenizing, in parallel:           {result['replica_detokenize_ms']:.2f} ms")
    ratio = result["worker_in_worker_ms"] / result["worker_in_replica_ms"]
    print(f"  the worker's share, in the worker / in the replicas:    {ratio:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
