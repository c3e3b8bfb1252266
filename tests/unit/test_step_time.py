"""The roofline step-time model (handler/neuron/step_time.py) and its calibration on published
points (handler/neuron/step_calibration.py). The calibration must reproduce its own points; the
held-out validation (P10) is a measurement, printed here, not asserted."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from handler.neuron.memory import ModelShape
from handler.neuron.step_calibration import calibrated, format_validation, load_points, p10
from handler.neuron.step_time import (
    BF16_FLOPS_PER_CORE,
    HBM_BYTES_PER_S_PER_CORE,
    Calibration,
    CoreWork,
    decode_ms,
    fit,
    mean_kv_positions,
    prefill_ms,
    token_bucket,
)

REPO = Path(__file__).resolve().parent.parent.parent
LLAMA_2_7B = ModelShape.from_path(REPO / "tests" / "fixtures" / "configs" / "llama-2-7b.json")
LLAMA_31_8B = ModelShape.from_path(REPO / "tests" / "fixtures" / "configs" / "llama-3.1-8b.json")


def test_the_hardware_constants_are_the_published_peaks_per_core():
    assert HBM_BYTES_PER_S_PER_CORE * 24 == pytest.approx(9.84e12)  # inf2.48xlarge: 12 chips x 820 GB/s
    assert BF16_FLOPS_PER_CORE * 24 == pytest.approx(2280e12)  # 12 chips x 190 TFLOPS


def test_core_work_of_llama_2_7b_at_tp24_pads_the_heads():
    work = CoreWork.of(LLAMA_2_7B, 24)
    assert work.attention_width == 2 * 128  # 32 heads padded to 48: 2 per core
    # q, k, v, o over 48 padded heads, the MLP (11008 -> 11016 = 459 x 24), lm_head (32000 / 24 rows), bf16
    per_layer = 4096 * 128 * 4 * 48 / 24 + 3 * 4096 * 459
    assert work.weight_bytes == pytest.approx((32 * per_layer + 1334 * 4096) * 2)
    assert work.kv_bytes_per_position == 2 * 32 * 2 * 128 * 2  # K and V, 32 layers, 2 heads, bf16


def test_core_work_int8_and_gqa():
    bf16, int8 = CoreWork.of(LLAMA_31_8B, 8), CoreWork.of(LLAMA_31_8B, 8, "int8")
    lm_head = 128256 / 8 * 4096 * 2
    assert int8.weight_bytes - lm_head == pytest.approx((bf16.weight_bytes - lm_head) / 2)  # lm_head stays 16-bit
    assert int8.int8_bytes == pytest.approx(int8.weight_bytes - lm_head) and bf16.int8_bytes == 0
    assert bf16.kv_bytes_per_position == 2 * 32 * 1 * 128 * 2  # 8 kv heads over 8 cores
    assert CoreWork.of(LLAMA_31_8B, 24).kv_bytes_per_position == 2 * 32 * 1 * 128 * 2  # replicated to 24


def test_token_buckets():
    assert [token_bucket(n, 4096) for n in (1, 128, 129, 2049, 5000)] == [128, 128, 256, 4096, 4096]
    # 128 prompt tokens, 128 output: the prefill gives the first, 127 decode steps hold 129..255 positions
    assert mean_kv_positions(128, 128, 4096) == 256
    assert mean_kv_positions(100, 29, 4096) == 128  # 101..128 positions
    assert mean_kv_positions(100, 30, 4096) == (28 * 128 + 256) / 29  # the last step holds 129
    assert mean_kv_positions(100, 1, 4096) == 128  # no decode step: the next one's bucket


def test_steps_grow_with_rows_context_and_tokens():
    cal = Calibration(
        bandwidth_efficiency=0.6,
        kv_bandwidth_efficiency=0.3,
        layer_overhead_ms=0.1,
        row_overhead_ms=0.4,
        int8_upcast=1.5,
        prefill_overhead_ms=20.0,
        prefill_bandwidth_efficiency=0.8,
        compute_efficiency=0.15,
        attention_efficiency=0.02,
    )
    work = CoreWork.of(LLAMA_2_7B, 8)
    assert decode_ms(work, 1, 128, cal) < decode_ms(work, 8, 128, cal) < decode_ms(work, 8, 4096, cal)
    assert prefill_ms(work, 1, 128, cal) < prefill_ms(work, 1, 1024, cal) < prefill_ms(work, 2, 1024, cal)
    assert decode_ms(CoreWork.of(LLAMA_2_7B, 24), 1, 128, cal) < decode_ms(work, 1, 128, cal)
    # int8 halves the layers' bytes; their conversion (int8_upcast) costs back part of the saving
    int8 = CoreWork.of(LLAMA_2_7B, 8, "int8")
    read_only = Calibration(**{**cal.__dict__, "int8_upcast": 0.0})
    assert decode_ms(int8, 1, 128, read_only) < decode_ms(int8, 1, 128, cal) < decode_ms(work, 1, 128, cal)


def test_fit_is_exact_with_as_many_points_as_unknowns_and_refuses_fewer():
    assert fit([[1, 0], [1, 1]], [2.0, 5.0]) == pytest.approx((2.0, 3.0))
    with pytest.raises(ValueError, match="unknowns"):
        fit([[1, 0, 0], [0, 1, 0]], [1.0, 2.0])
    with pytest.raises(ValueError, match="rank"):
        fit([[1, 1], [2, 2]], [1.0, 2.0])


def test_the_calibration_points_come_back_and_the_constants_are_physical():
    cal, checks = calibrated()
    calibration_points = [c for c in checks if c.point.role == "calibrate"]
    assert {c.point.kind for c in calibration_points} == {"decode", "prefill"}
    for c in calibration_points:
        assert c.predicted_ms == pytest.approx(c.point.published_ms, rel=1e-9), c.point.id
    assert 0 < cal.bandwidth_efficiency <= 1 and 0 < cal.prefill_bandwidth_efficiency <= 1
    assert 0 < cal.kv_bandwidth_efficiency <= 1
    assert 0 < cal.compute_efficiency <= 1 and 0 < cal.attention_efficiency <= 1
    assert cal.layer_overhead_ms > 0 and cal.row_overhead_ms > 0 and cal.prefill_overhead_ms > 0
    assert cal.int8_upcast > 0
    assert all(math.isfinite(c.ratio) and c.ratio > 0 for c in checks)


def test_the_points_file_holds_the_brief_s_held_out_points_with_sources():
    points = {p.id: p for p in load_points()}
    held_out = {p.model for p in points.values() if p.role == "validate"}
    assert {"llama-2-13b", "llama-3-8b", "llama-3.1-8b", "llama-2-70b"} <= held_out
    assert any(p.tp_degree == 8 and p.role == "validate" for p in points.values())
    assert all(p.source and p.published_ms > 0 for p in points.values())
    # a point left out of P10 says why, and a superseded one names a point of the file
    assert all(points[p.superseded_by].kind == p.kind for p in points.values() if p.superseded_by)
    assert all(p.note for p in points.values() if p.superseded_by or p.serving_level)


def test_the_validation_is_printed(capsys: pytest.CaptureFixture[str]):
    cal, checks = calibrated()
    table = format_validation(checks, cal)
    with capsys.disabled():
        print("\n" + table)  # P10 is a measurement of the model: shown, not asserted
    assert "P10 decode" in table and "P10 prefill" in table
    assert p10(checks, "decode") is not None
