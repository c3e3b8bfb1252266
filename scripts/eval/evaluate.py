"""`make eval`: lm-eval's `local-completions` client against a served model, on the tasks the
project ships (eval/tasks, data in eval/data: no dataset download), then the scores.

lm-eval sends the OpenAI completions route token-id prompts it tokenized itself with the
checkpoint's tokenizer (`--tokenizer`): loglikelihood requests ask for `echo` + `logprobs`
and one generated token, and read the prompt's logprobs; generate_until requests are greedy
completions with stop strings. So the same command against hf on CPU and against neuronx on
an inf2 host, with the same checkpoint, answers "did the Neuron build change the model's
answers?": scripts/eval/compare.py compares the two runs sample by sample.

    python -m scripts.eval.evaluate --url http://127.0.0.1:8080 --model llama --tokenizer models/tiny-llama
    python -m scripts.eval.evaluate ... --limit 5 --out build/eval/hf
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
TASKS_DIR = REPO / "eval" / "tasks"
TASKS = ("inf2_choice", "inf2_generate")
DEFAULT_LM_EVAL = REPO / ".venv" / "lm-eval" / "bin" / "lm_eval"

from scripts.serve.client import inference_key


def completions_url(url: str, model: str) -> str:
    return f"{url.rstrip('/')}/predictions/{model}/1.0/v1/completions"


def lm_eval_command(args: argparse.Namespace) -> list[str]:
    model_args = {
        "base_url": completions_url(args.url, args.model),
        "model": args.model,
        "tokenizer": str(Path(args.tokenizer).resolve()),
        "tokenizer_backend": "huggingface",  # the checkpoint's tokenizer; no probe of a /tokenize route
        "tokenized_requests": "True",  # token ids: the server scores exactly the tokens lm-eval counts
        "max_length": str(args.max_length),
        "num_concurrent": str(args.concurrency),
        "max_retries": "1",
        "timeout": "120",
    }
    command = [str(args.lm_eval), "--model", "local-completions"]
    command += ["--model_args", ",".join(f"{k}={v}" for k, v in model_args.items())]
    command += ["--include_path", str(TASKS_DIR), "--tasks", ",".join(args.tasks)]
    command += ["--output_path", str(args.out.resolve()), "--log_samples", "--seed", "1234"]
    if args.limit:
        command += ["--limit", str(args.limit)]
    return command


def lm_eval_env(args: argparse.Namespace) -> dict[str, str]:
    """Offline, with a private cache, and the inference key where lm-eval sends its API key."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(args.out.resolve() / "hf")}
    env["OPENAI_API_KEY"] = (inference_key(args.key_file) if args.key_file else None) or "none"
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def latest_results(out: Path) -> Path:
    """lm-eval writes <out>/<model>/results_<timestamp>.json; the newest one."""
    found = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise SystemExit(f"lm-eval wrote no results under {out}")
    return found[-1]


def scores(results: dict[str, Any]) -> list[tuple[str, str, float, float | None, int | None]]:
    """(task, metric, value, stderr, samples) for every metric of every task."""
    rows = []
    for task, metrics in sorted(results["results"].items()):
        n = results.get("n-samples", {}).get(task, {}).get("effective")
        for key, value in sorted(metrics.items()):
            if not isinstance(value, (int, float)) or "," not in key or "_stderr" in key:
                continue  # "acc,none" is a metric (with its filter); "sample_len" is not
            metric = key.split(",")[0]
            stderr = metrics.get(key.replace(f"{metric},", f"{metric}_stderr,"))
            rows.append((task, metric, float(value), stderr if isinstance(stderr, (int, float)) else None, n))
    return rows


def format_scores(rows: list[tuple[str, str, float, float | None, int | None]]) -> str:
    lines = [f"{'task':<16} {'metric':<12} {'value':>7} {'stderr':>7} {'samples':>7}"]
    for task, metric, value, stderr, n in rows:
        err = f"{stderr:7.3f}" if stderr is not None else f"{'-':>7}"
        lines.append(f"{task:<16} {metric:<12} {value:7.3f} {err} {n if n is not None else '-':>7}")
    return "\n".join(lines)


def server_answers(url: str, timeout_s: float = 5.0) -> bool:
    """Whether anything answers HTTP at `url` (TorchServe's /ping), whatever the status."""
    try:
        httpx.get(f"{url.rstrip('/')}/ping", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the TorchServe inference address")
    parser.add_argument("--model", default="llama")
    parser.add_argument("--tokenizer", type=Path, required=True, help="the served checkpoint (its tokenizer)")
    parser.add_argument("--key-file", type=Path, default=Path("key_file.json"), help="TorchServe's key file")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--limit", type=int, help="the first N samples of each task")
    parser.add_argument("--max-length", type=int, default=1024, help="the model's n_positions")
    parser.add_argument("--concurrency", type=int, default=1, help="requests lm-eval keeps in flight")
    parser.add_argument("--out", type=Path, default=REPO / "build" / "eval")
    parser.add_argument("--lm-eval", type=Path, default=DEFAULT_LM_EVAL, help="lm-eval's CLI (make lm-eval)")
    args = parser.parse_args(argv)
    if not args.lm_eval.exists():
        raise SystemExit(f"{args.lm_eval} not found: run `make lm-eval` (its own venv, requirements-eval.txt)")
    if not server_answers(args.url):
        raise SystemExit(f"nothing answers at {args.url}: start the server first (`make serve`), or pass EVAL_URL")
    args.out.mkdir(parents=True, exist_ok=True)

    command = lm_eval_command(args)
    print("+ " + " ".join(command), flush=True)
    # cwd: the task files name their data relative to the repository root.
    done = subprocess.run(command, cwd=REPO, env=lm_eval_env(args))
    if done.returncode != 0:
        return done.returncode
    path = latest_results(args.out)
    print(f"\nlm-eval scores ({path}):")
    print(format_scores(scores(json.loads(path.read_text()))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
