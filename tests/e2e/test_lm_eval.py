"""`make eval` for real: lm-eval 0.4.13 (its own venv) against a real torchserve with the hf
backend and the tiny model, on a slice of the shipped tasks (scripts/eval/evaluate.py).

It must finish with scores for both tasks, every loglikelihood lm-eval computed from our
prompt logprobs must equal the model's own (transformers, directly, no server), and
scripts/eval/compare.py must find a run identical to itself and tell two different runs apart.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.eval.compare import load_samples
from scripts.eval.evaluate import latest_results
from tests.support.modes import with_mode
from tests.support.tool_venv import tool_bin
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[2]
LIMIT = 3
N_POSITIONS = 512
CONFIG = {
    "minWorkers": 1,
    "maxWorkers": 1,
    "batchSize": 8,
    "responseTimeout": 60,
    "handler": {
        "model_checkpoint_dir": "model",
        "n_positions": N_POSITIONS,
        "default_max_new_tokens": 16,
        "max_new_tokens": 64,
    },
}


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    config = with_mode(CONFIG, "continuous", n_slots=4)
    ts = start_torchserve(tmp_path_factory.mktemp("torchserve-eval"), tiny_model_dir, config)
    try:
        yield ts
    finally:
        ts.stop()


def run_eval(server: TorchServe, tiny_model_dir: Path, out: Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "scripts.eval.evaluate", "--url", server.url, "--model", server.model_name]
    command += ["--tokenizer", str(tiny_model_dir), "--key-file", str(server.key_file), "--limit", str(LIMIT)]
    command += ["--max-length", str(N_POSITIONS), "--out", str(out)]
    command += ["--lm-eval", str(tool_bin("lm-eval", "requirements-eval.txt", "lm_eval"))]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


def loglikelihood(model_log_softmax, tokenizer, context: str, continuation: str) -> float:
    """log P(continuation | context) from the model itself, tokenized as lm-eval does: the
    whole string and the context without special tokens, the continuation as the difference."""
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    logprobs = model_log_softmax(whole)
    return sum(float(logprobs[i - 1, whole[i]]) for i in range(len(context_ids), len(whole)))


@pytest.mark.timeout(900)  # installs lm-eval's venv first when `make lm-eval` has not (a few minutes)
def test_lm_eval_scores_both_tasks_from_the_models_own_loglikelihoods(
    server, tiny_model_dir: Path, tiny_tokenizer, model_log_softmax, tmp_path: Path
):
    out = tmp_path / "eval"
    done = run_eval(server, tiny_model_dir, out)
    print(done.stdout[-2500:])
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(latest_results(out).read_text())["results"]
    assert 0.0 <= results["inf2_choice"]["acc,none"] <= 1.0
    assert 0.0 <= results["inf2_generate"]["exact_match,none"] <= 1.0
    assert "inf2_choice" in done.stdout.split("lm-eval scores")[-1]  # our table, after lm-eval's own

    samples = load_samples(out)
    assert sorted(samples) == ["inf2_choice", "inf2_generate"]
    assert len(samples["inf2_choice"]) == LIMIT and len(samples["inf2_generate"]) == LIMIT
    for sample in samples["inf2_choice"].values():
        arguments = [(a["arg_0"], a["arg_1"]) for a in sample["arguments"].values()]
        served = [float(ll) for ll, _greedy in sample["filtered_resps"]]
        own = [loglikelihood(model_log_softmax, tiny_tokenizer, context, cont) for context, cont in arguments]
        assert served == pytest.approx(own, abs=1e-3), sample["doc"]
    for sample in samples["inf2_generate"].values():
        assert isinstance(sample["filtered_resps"][0], str)

    # The comparison: a run against itself agrees everywhere; a changed loglikelihood is caught.
    compare = [sys.executable, "-m", "scripts.eval.compare"]
    same = subprocess.run(
        [*compare, str(out), str(out), "--strict", "--max-ll-diff", "0"], capture_output=True, text=True, cwd=REPO
    )
    assert same.returncode == 0 and f"same choice: {LIMIT}/{LIMIT}" in same.stdout, same.stdout + same.stderr
    altered = tmp_path / "altered"
    altered.mkdir()
    (path,) = out.rglob("samples_inf2_choice_*.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines[0]["filtered_resps"][0][0] = str(float(lines[0]["filtered_resps"][0][0]) - 0.5)
    (altered / path.name).write_text("".join(json.dumps(line) + "\n" for line in lines))
    differs = subprocess.run(
        [*compare, str(out), str(altered), "--max-ll-diff", "0.1"], capture_output=True, text=True, cwd=REPO
    )
    assert differs.returncode == 1 and "max 5.00e-01" in differs.stdout, differs.stdout + differs.stderr
