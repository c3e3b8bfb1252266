"""`make plan --speculation-k K --acceptance-rate A` (scripts/plan): the verify step is the step-time
model's forward of (K + 1) x slots tokens, the generated sim profiles carry it (so the sim charges
what the plan models), the speculative pace is verify / E with E = (1 - A^(K+1)) / (1 - A), and the
report moves ITL and tok/s the expected way and says it is a model, not a measurement."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.backends.sim_profile import expected_tokens_per_step, load_profile
from handler.neuron.memory import ModelShape
from handler.neuron.step_calibration import calibrated
from handler.neuron.step_time import Calibration, CoreWork, decode_ms, token_bucket
from scripts.plan import planner as plan
from scripts.plan import profiles as gen
from scripts.plan.layouts import Workload
from scripts.plan.report import MODEL_NOT_MEASUREMENT
from scripts.plan.sweep import WIDEST_DRAFT, Speculation, speculative_profile, step_profile, verify_ms
from tests.support.bench import REPO

CONFIGS = REPO / "tests" / "fixtures" / "configs"
EIGHT_B = CONFIGS / "llama-3.1-8b.json"


@pytest.fixture(scope="module")
def layout() -> tuple[CoreWork, Calibration, Workload]:
    cal, _ = calibrated()
    return CoreWork.of(ModelShape.from_path(EIGHT_B), 8), cal, Workload(1500, 250)


def test_a_verify_reads_weights_and_caches_once_and_pays_the_row_overhead_per_token(layout):
    work, cal, _ = layout
    step = decode_ms(work, 32, 2048, cal)
    assert verify_ms(work, 32, 0, 2048, cal) == pytest.approx(step)
    for k in (1, 3, 8):
        assert verify_ms(work, 32, k, 2048, cal) == pytest.approx(step + k * 32 * cal.row_overhead_ms)
    # below the decode of (k + 1) x 32 separate rows, which would read each cache k + 1 times
    assert verify_ms(work, 32, 3, 2048, cal) < decode_ms(work, 4 * 32, 2048, cal)


def test_the_plan_s_profile_charges_the_model_s_verify_for_every_k(layout):
    """step_profile's point at the widest verify: the sim's linear table gives every narrower k."""
    work, cal, workload = layout
    profile = step_profile("t", work, cal, 32, 2048, workload, 128_256)
    kv = token_bucket(workload.longest_prompt + workload.output_tokens, 2048)
    assert profile.decode_s(32) == profile.decode_s(1)  # the plain step: every slot, whatever is live
    for k in range(1, WIDEST_DRAFT + 1):
        assert profile.verify_s(32, k) * 1000 == pytest.approx(verify_ms(work, 32, k, kv, cal), abs=1e-3)


def test_the_shipped_generated_profile_carries_the_verify(layout):
    spec = gen.SPECS[0]
    shipped = load_profile(spec.path)
    cal, _ = calibrated()
    work = CoreWork.of(ModelShape.from_path(EIGHT_B), spec.tp_degree)
    w = spec.workload
    kv = token_bucket(w.longest_prompt + w.output_tokens, spec.n_positions)
    for k in (1, 3, 8):
        assert shipped.verify_s(spec.n_slots, k) * 1000 == pytest.approx(
            verify_ms(work, spec.n_slots, k, kv, cal), abs=1e-3
        )
    assert "verify:" in spec.path.read_text()


def test_the_speculative_pace_is_verify_over_the_expected_tokens(layout):
    work, cal, workload = layout
    profile = step_profile("t", work, cal, 32, 2048, workload, 128_256)
    step = profile.decode_s(32) * 1000
    for rate in (0.0, 0.5, 0.9):
        s = Speculation(3, rate)
        assert s.tokens_per_step == expected_tokens_per_step(rate, 3)
        pace = speculative_profile(profile, s).decode_s(32) * 1000
        assert pace == pytest.approx(s.verify_ms(profile) / s.tokens_per_step, abs=1e-3)
        assert speculative_profile(profile, s).prefill_ms == profile.prefill_ms
    assert speculative_profile(profile, Speculation(3, 0.0)).decode_s(32) * 1000 > step  # the wider forward, 1 token
    assert speculative_profile(profile, Speculation(3, 0.9)).decode_s(32) * 1000 < step


def run(capsys: pytest.CaptureFixture[str], tmp_path: Path, *more: str) -> tuple[str, dict]:
    argv = ["--model", str(EIGHT_B), "--instance", "inf2.48xlarge", "--slots", "8,16,32", "--requests", "80"]
    code = plan.main([*argv, "--prefill-token-budget", "2048", "--out", str(tmp_path), *more])
    out = capsys.readouterr().out
    assert code == 0, out
    return out, json.loads((tmp_path / "plan-llama-3.1-8b.json").read_text())


def test_the_report_moves_itl_and_tokens_the_expected_way_and_says_it_is_a_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    plain_out, plain = run(capsys, tmp_path)
    assert "speculation" not in plain and MODEL_NOT_MEASUREMENT.upper() not in plain_out
    by_layout = {(r["tp_degree"], r["replicas"], r["n_slots"]): r for r in plain["layouts"] if "tokens_per_s" in r}

    out, high = run(capsys, tmp_path, "--speculation-k", "3", "--acceptance-rate", "0.9")
    assert f"Speculative decoding, {MODEL_NOT_MEASUREMENT.upper()}" in out
    assert out.index("Speculative decoding") < out.index("Winner:")  # the snippet stays last
    spec = high["speculation"]
    assert spec["kind"] == MODEL_NOT_MEASUREMENT and spec["draft_tokens"] == 3 and spec["acceptance_rate"] == 0.9
    assert spec["tokens_per_step"] == pytest.approx(expected_tokens_per_step(0.9, 3), abs=1e-4)
    assert high["layouts"] == plain["layouts"]  # the plain plan is unchanged
    assert len(spec["layouts"]) == plan.SPECULATIVE_LAYOUTS  # the top layouts that fit
    for row in spec["layouts"]:
        base = by_layout[(row["tp_degree"], row["replicas"], row["n_slots"])]
        assert row["verify_ms"] > row["step_ms"] > row["ms_per_token"]
        assert row["tokens_per_s"] > base["tokens_per_s"]
        assert row["itl_p50_ms"] < base["itl_p50_ms"]

    _, zero = run(capsys, tmp_path, "--speculation-k", "3", "--acceptance-rate", "0")
    for row in zero["speculation"]["layouts"]:  # a wider forward for one token: slower on both counts
        base = by_layout[(row["tp_degree"], row["replicas"], row["n_slots"])]
        assert row["ms_per_token"] == pytest.approx(row["verify_ms"]) and row["verify_ms"] > row["step_ms"]
        assert "tokens_per_s" not in row or row["tokens_per_s"] < base["tokens_per_s"]
        assert "itl_p50_ms" not in row or row["itl_p50_ms"] > base["itl_p50_ms"]


def test_the_acceptance_rate_defaults_to_the_sim_s(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    _, figures = run(capsys, tmp_path, "--speculation-k", "2")
    assert figures["speculation"]["acceptance_rate"] == plan.DEFAULT_ACCEPTANCE == 0.5


@pytest.mark.parametrize(
    "argv",
    [
        ["--acceptance-rate", "0.5"],  # without --speculation-k
        ["--speculation-k", "0"],
        ["--speculation-k", str(WIDEST_DRAFT + 1)],
        ["--speculation-k", "3", "--acceptance-rate", "1.5"],
        ["--speculation-k", "3", "--acceptance-rate", "nan"],
    ],
)
def test_meaningless_speculation_options_are_refused(argv: list[str], tmp_path: Path):
    with pytest.raises(SystemExit) as exited:
        plan.main(["--model", str(EIGHT_B), "--out", str(tmp_path), *argv])
    assert exited.value.code == 2
