"""`make plan` (scripts/plan/planner.py): on the tiny model and on a 7B config.json it finishes and names
a winner whose model-config.yaml snippet the handler accepts; layouts that cannot load say which
limit they hit. No timing assertions: the sweep is a model, and the machine is shared."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent.parent.parent
from handler.config import ServingConfig
from handler.neuron.memory import ModelShape
from scripts.plan import planner as plan
from scripts.plan import sweep
from scripts.plan.layouts import Candidate, Workload, fit_problem_of, load_instances

CONFIGS = REPO / "tests" / "fixtures" / "configs"


def snippet_of(output: str) -> dict:
    text = output.split("model-config.yaml:\n", 1)[1]
    return yaml.safe_load(text.split("\n(", 1)[0])


def run_plan(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """scripts/plan/planner.py's exit code and what it printed (stdout, then stderr)."""
    code = plan.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_plan_on_the_7b_config_names_a_winner(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, out = run_plan(
        capsys, "--model", str(CONFIGS / "llama-2-7b.json"), "--instance", "inf2.48xlarge", "--out", str(tmp_path)
    )
    assert code == 0, out
    assert out.index("P10 decode") < out.index("Plan for llama-2-7b")  # the validation comes first
    assert "WINNER" in out and "Winner: inf2.48xlarge" in out
    config = ServingConfig.from_model_yaml(snippet_of(out))
    assert config.scheduler.mode == "continuous"
    assert config.scheduler.replicas * config.handler.tp_degree <= 24
    assert (tmp_path / "plan-llama-2-7b.png").stat().st_size > 0
    report = json.loads((tmp_path / "plan-llama-2-7b.json").read_text())
    winner = report["layouts"][0]  # ranked: the winner first
    price = load_instances().instances["inf2.48xlarge"].usd_per_hour
    expected = price / (winner["tokens_per_s"] * 3600) * 1e6
    assert winner["usd_per_million_tokens"] == pytest.approx(expected, rel=1e-3)
    assert winner["itl_p50_ms"] <= 50 and winner["ttft_p90_ms"] <= 1000  # within the default SLO
    snippet = (config.handler.tp_degree, config.scheduler.n_slots, config.scheduler.replicas)
    assert snippet == (winner["tp_degree"], winner["n_slots"], winner["replicas"])  # the snippet is the winner's
    assert any(row["no_fit"] and row["no_fit"].startswith("HBM per core") for row in report["layouts"])


def test_make_plan_on_the_tiny_model(tiny_model_dir: Path, tmp_path: Path):
    """Through make, as a user runs it (the venv and the model taken as built)."""
    venv = Path(sys.executable).parent.parent
    make = "make -o venv -o model plan PROMPT_TOKENS=100 OUTPUT_TOKENS=64".split()
    variables = [
        f"VENV={venv}",
        f"MODEL_DIR={tiny_model_dir}",
        f"BUILD={tmp_path}",
        "INSTANCE=inf2.xlarge inf2.48xlarge",
    ]
    result = subprocess.run(
        make + variables,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Winner: " in result.stdout and "P10 decode" in result.stdout
    ServingConfig.from_model_yaml(snippet_of(result.stdout))
    assert (tmp_path / "plan" / f"plan-{tiny_model_dir.name}.png").is_file()


def test_a_layout_that_cannot_load_names_its_limit():
    prices = load_instances()
    xlarge = prices.instances["inf2.xlarge"]
    seventy = ModelShape.from_path(CONFIGS / "llama-2-70b.json")
    eight = ModelShape.from_path(CONFIGS / "llama-3.1-8b.json")
    workload = Workload(1500, 250)
    hbm = fit_problem_of(seventy, Candidate(xlarge, 2, 1, workload.n_positions(seventy)))
    assert hbm is not None and hbm.startswith("HBM per core") and "> 16 GiB; try tp_degree" in hbm
    host = fit_problem_of(eight, Candidate(xlarge, 2, 4, workload.n_positions(eight)))
    assert host is not None and host.startswith("host RAM") and "inf2.xlarge" in host
    # pre-sharded weights (nxdi) load without sharding on the host: only HBM is a limit then
    assert fit_problem_of(eight, Candidate(xlarge, 2, 4, workload.n_positions(eight)), presharded=True) is None
    assert fit_problem_of(seventy, Candidate(xlarge, 2, 1, workload.n_positions(seventy)), presharded=True) == hbm


def test_no_winner_and_a_workload_beyond_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    code, out = run_plan(
        capsys, "--model", str(CONFIGS / "llama-2-70b.json"), "--instance", "inf2.xlarge", "--out", str(tmp_path)
    )
    assert code == 1 and "No winner" in out and "does not fit: HBM per core" in out
    code, out = run_plan(
        capsys, "--model", str(CONFIGS / "llama-2-7b.json"), "--prompt-tokens", "5000", "--out", str(tmp_path)
    )
    assert code == 2 and "max_position_embeddings" in out


def test_n_positions_holds_the_largest_bucket_and_the_output_rounded_to_512():
    eight = ModelShape.from_path(CONFIGS / "llama-3.1-8b.json")
    assert Workload(1500, 250).n_positions(eight) == 2048  # bucket 1536 + 250
    assert Workload(15900, 450).n_positions(eight) == 16896  # bucket 15936 + 450; not 32768
    seven = ModelShape.from_path(CONFIGS / "llama-2-7b.json")  # max_position_embeddings 4096
    with pytest.raises(ValueError, match="max_position_embeddings"):
        Workload(4000, 250).n_positions(seven)


@pytest.mark.parametrize(
    ("option", "value"),
    [("--price", "inf2.xlarge=0"), ("--price", "inf2.xlarge=nan"), ("--output-tokens", "1"), ("--requests", "0")],
)
def test_arguments_that_would_make_a_meaningless_plan_are_refused(option: str, value: str, tmp_path: Path):
    with pytest.raises(SystemExit) as exited:
        plan.main(["--model", str(CONFIGS / "llama-2-7b.json"), option, value, "--out", str(tmp_path)])
    assert exited.value.code == 2


def test_the_winner_s_prefill_token_budget_is_searched_and_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    argv = ["--model", str(CONFIGS / "llama-3.1-8b.json"), "--instance", "inf2.48xlarge", "--out", str(tmp_path)]
    code, out = run_plan(capsys, *argv, "--prompt-spread", "150")
    assert code == 0, out
    budgets = json.loads((tmp_path / "plan-llama-3.1-8b.json").read_text())["prefill_token_budget"]
    assert [t["budget"] for t in budgets["tried"]] == [k * (1500 + 3 * 150) for k in sweep.BUDGET_PROMPTS]
    assert snippet_of(out)["scheduler"]["prefill_token_budget"] == budgets["chosen"]
    assert "scheduler.prefill_token_budget for the winner" in out and "<- chosen" in out
    code, out = run_plan(capsys, *argv, "--prefill-token-budget", "4096")
    assert code == 0, out
    assert snippet_of(out)["scheduler"]["prefill_token_budget"] == 4096 and "<- chosen" not in out


def test_the_budget_chosen_serves_most_then_waits_least_then_is_smallest(monkeypatch: pytest.MonkeyPatch):
    def point(rate: float, ttft_p90: float) -> sweep.Sweep:
        summary = SimpleNamespace(ttft_ms=SimpleNamespace(p90=ttft_p90), itl_ms=SimpleNamespace(p50=40.0))
        return sweep.Sweep([sweep.LoadPoint(rate, 1, summary, None)])  # type: ignore[arg-type]

    outcomes = {1: point(1.0, 500), 2: point(1.2, 600), 4: point(1.2, 550), 8: sweep.Sweep()}
    monkeypatch.setattr(sweep, "sweep", lambda *a, budget, **k: outcomes[budget // 100])
    workload = Workload(100, 50)
    chosen, trials = sweep.choose_budget(None, 1, workload, sweep.SLO(1000, 50))  # type: ignore[arg-type]
    assert chosen is not None and chosen.prompts == 4 and [t.budget for t in trials] == [100, 200, 400, 800]
    assert "misses the SLO at every load" in sweep.format_budgets(chosen, trials)
    outcomes[4] = point(1.2, 600)  # a tie on rate and TTFT: the smaller budget
    assert sweep.choose_budget(None, 1, workload, sweep.SLO(1000, 50))[0].prompts == 2  # type: ignore[arg-type,union-attr]
    outcomes.update({k: sweep.Sweep() for k in outcomes})
    assert sweep.choose_budget(None, 1, workload, sweep.SLO(1000, 50))[0] is None  # type: ignore[arg-type]
