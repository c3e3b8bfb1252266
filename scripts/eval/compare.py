"""Compare two `make eval` runs sample by sample: did two builds of one checkpoint (hf on CPU
and neuronx on Inferentia2, f32 and bf16, ...) give the same answers?

For each task both runs logged (lm-eval's --log_samples, samples_<task>_<date>.jsonl), matched
by document:
- loglikelihood tasks: how often both picked the same choice, and the largest and mean
  difference of the choices' loglikelihoods;
- generate_until tasks: how often the generated answers are identical.

    python -m scripts.eval.compare build/eval/hf build/eval/neuronx [--max-ll-diff 0.05]

Exit status 1 when --max-ll-diff is given and exceeded, or a choice or an answer differs
with --strict.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path


def load_samples(run: Path) -> dict[str, dict[int, dict]]:
    """{task: {doc_id: sample}} from a run's newest samples file per task."""
    newest: dict[str, Path] = {}
    for path in sorted(run.rglob("samples_*.jsonl"), key=lambda p: p.stat().st_mtime):
        task = path.name[len("samples_") :].rsplit("_", 1)[0]
        newest[task] = path
    out: dict[str, dict[int, dict]] = {}
    for task, path in newest.items():
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        out[task] = {int(sample["doc_id"]): sample for sample in lines}
    return out


def loglikelihoods(sample: dict) -> list[float] | None:
    """A loglikelihood sample's per-choice values; None for a generation sample."""
    resps = sample["filtered_resps"]
    if resps and isinstance(resps[0], list) and len(resps[0]) == 2:
        return [float(ll) for ll, _greedy in resps]
    return None


@dataclass
class TaskComparison:
    task: str
    docs: int
    agree: int
    max_ll_diff: float | None = None
    mean_ll_diff: float | None = None

    def line(self) -> str:
        kind = "same choice" if self.max_ll_diff is not None else "same answer"
        text = f"{self.task:<16} {self.docs:>5} docs  {kind}: {self.agree}/{self.docs} ({self.agree / self.docs:.0%})"
        if self.max_ll_diff is not None:
            text += f"  |delta loglikelihood| max {self.max_ll_diff:.2e} mean {self.mean_ll_diff:.2e}"
        return text


def compare_task(task: str, a: dict[int, dict], b: dict[int, dict]) -> TaskComparison | None:
    docs = sorted(set(a) & set(b))
    if not docs:
        return None
    first = loglikelihoods(a[docs[0]])
    if first is None:
        same = sum(a[d]["filtered_resps"][0] == b[d]["filtered_resps"][0] for d in docs)
        return TaskComparison(task, len(docs), same)
    diffs: list[float] = []
    same = 0
    for doc in docs:
        lls_a, lls_b = loglikelihoods(a[doc]) or [], loglikelihoods(b[doc]) or []
        diffs += [abs(x - y) for x, y in zip(lls_a, lls_b, strict=True)]
        same += lls_a.index(max(lls_a)) == lls_b.index(max(lls_b))
    return TaskComparison(task, len(docs), same, max(diffs), sum(diffs) / len(diffs))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_a", type=Path, help="one `make eval` output folder (EVAL_OUT)")
    parser.add_argument("run_b", type=Path, help="the other")
    parser.add_argument("--max-ll-diff", type=float, help="fail above this loglikelihood difference")
    parser.add_argument("--strict", action="store_true", help="fail on any differing choice or answer")
    args = parser.parse_args(argv)
    a, b = load_samples(args.run_a), load_samples(args.run_b)
    comparisons = [c for task in sorted(set(a) & set(b)) if (c := compare_task(task, a[task], b[task]))]
    if not comparisons:
        print(f"no task with samples in both {args.run_a} and {args.run_b}")
        return 1
    print(f"{args.run_a} vs {args.run_b}")
    for comparison in comparisons:
        print(comparison.line())
    failed = any(
        (args.strict and c.agree < c.docs)
        or (args.max_ll_diff is not None and c.max_ll_diff is not None and c.max_ll_diff > args.max_ll_diff)
        for c in comparisons
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
