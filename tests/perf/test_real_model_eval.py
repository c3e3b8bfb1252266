"""`make eval` on the real model agrees with lm-eval's own `hf` backend.

The project's eval path (scripts/eval/evaluate.py: lm-eval's local-completions client against
the real torchserve, loglikelihoods from the server's echoed prompt logprobs) and lm-eval's
`--model hf` (transformers in lm-eval's own venv, the same float32 checkpoint, no server) run
the shipped tasks, every sample: inf2_choice (20 questions x 4 endings: 80 loglikelihood
requests) and inf2_generate (20 greedy answers of up to 16 tokens). The scores must agree within
1e-3, every per-choice loglikelihood too, the greedy answers must be the same text, and the
real model must pick the right ending more often than chance.

In the perf tier (`make test-perf`), not the real-model tier: lm-eval's reference run alone takes
over a minute on 2 cores, and `make test` must stay under ten.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts.eval.compare import load_samples, loglikelihoods
from scripts.eval.evaluate import latest_results
from tests.support.tool_venv import tool_bin
from tests.support.torchserve_process import TorchServe

REPO = Path(__file__).resolve().parents[2]
TASKS = ("inf2_choice", "inf2_generate")
SAMPLES = 20  # each task's whole data file (eval/data/*.jsonl)
TOLERANCE = 1e-3


def lm_eval_bin() -> Path:
    return tool_bin("lm-eval", "requirements-eval.txt", "lm_eval")


def run(command: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert done.returncode == 0, f"{' '.join(command)}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done


@pytest.fixture(scope="module")
def served_run(real_server: TorchServe, real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`make eval`'s command against the real torchserve."""
    out = tmp_path_factory.mktemp("eval-served")
    command = [sys.executable, "-m", "scripts.eval.evaluate", "--url", real_server.url]
    command += ["--model", real_server.model_name, "--tokenizer", str(real_model_dir)]
    command += ["--key-file", str(real_server.key_file), "--out", str(out), "--lm-eval", str(lm_eval_bin())]
    command += ["--tasks", *TASKS]
    done = run(command)
    assert "inf2_choice" in done.stdout.split("lm-eval scores")[-1]  # evaluate.py's own table
    return out


@pytest.fixture(scope="module")
def reference_run(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """lm-eval's own hf backend on the same checkpoint, tasks and seed, offline."""
    out = tmp_path_factory.mktemp("eval-hf")
    command = [str(lm_eval_bin()), "--model", "hf"]
    command += ["--model_args", f"pretrained={real_model_dir},dtype=float32", "--device", "cpu", "--batch_size", "1"]
    command += ["--include_path", str(REPO / "eval" / "tasks"), "--tasks", ",".join(TASKS)]
    command += ["--output_path", str(out), "--log_samples", "--seed", "1234"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(out / "hf")}
    env["TOKENIZERS_PARALLELISM"] = "false"
    run(command, env)
    return out


def results(run_dir: Path) -> dict[str, dict[str, Any]]:
    return json.loads(latest_results(run_dir).read_text())["results"]


def metrics(task_results: dict[str, Any]) -> dict[str, float]:
    """{"acc,none": 0.8, "acc_stderr,none": 0.09, ...}: every number lm-eval reports for a task."""
    return {k: float(v) for k, v in task_results.items() if "," in k and isinstance(v, (int, float))}


@pytest.mark.timeout(900)  # installs lm-eval's venv first when `make lm-eval` has not (a few minutes)
def test_loglikelihood_scores_equal_lm_evals_hf_backend_and_beat_chance(served_run: Path, reference_run: Path):
    served, reference = results(served_run)["inf2_choice"], results(reference_run)["inf2_choice"]
    print(f"served: {metrics(served)}\nhf:     {metrics(reference)}")
    assert "acc,none" in metrics(served)
    assert metrics(served).keys() == metrics(reference).keys()
    for key, value in metrics(reference).items():
        assert metrics(served)[key] == pytest.approx(value, abs=TOLERANCE), key

    served_samples = load_samples(served_run)["inf2_choice"]
    reference_samples = load_samples(reference_run)["inf2_choice"]
    assert sorted(served_samples) == sorted(reference_samples) == list(range(SAMPLES))
    largest = 0.0
    for doc_id, sample in reference_samples.items():
        ours = served_samples[doc_id]
        assert ours["arguments"] == sample["arguments"], doc_id  # the same contexts and continuations
        theirs_ll, ours_ll = loglikelihoods(sample), loglikelihoods(ours)
        assert theirs_ll is not None and ours_ll is not None
        assert ours_ll == pytest.approx(theirs_ll, abs=TOLERANCE), sample["doc"]
        assert [greedy for _ll, greedy in ours["filtered_resps"]] == [g for _ll, g in sample["filtered_resps"]]
        largest = max(largest, *(abs(a - b) for a, b in zip(ours_ll, theirs_ll, strict=True)))
    print(f"largest loglikelihood difference: {largest:.2e}")

    chance = sum(1 / len(s["doc"]["choices"]) for s in served_samples.values()) / len(served_samples)
    assert chance == 0.25
    assert metrics(served)["acc,none"] > chance  # 0.8 measured (16 of 20)


def test_greedy_answers_equal_lm_evals_hf_backend(served_run: Path, reference_run: Path):
    served, reference = results(served_run)["inf2_generate"], results(reference_run)["inf2_generate"]
    assert metrics(served).keys() == metrics(reference).keys()
    for key, value in metrics(reference).items():
        assert metrics(served)[key] == pytest.approx(value, abs=TOLERANCE), key
    served_samples = load_samples(served_run)["inf2_generate"]
    reference_samples = load_samples(reference_run)["inf2_generate"]
    assert sorted(served_samples) == sorted(reference_samples) == list(range(SAMPLES))
    answers = {i: s["resps"][0][0] for i, s in served_samples.items()}
    assert answers == {i: s["resps"][0][0] for i, s in reference_samples.items()}
    assert any(answer.strip() for answer in answers.values())  # the model answers, not only stops
