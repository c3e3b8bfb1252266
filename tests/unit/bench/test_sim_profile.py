"""The timing profiles and how the simulated model reads them."""

import pytest
import yaml

from handler.backends.sim_profile import Profile, ProfileError, load_profile, resolve_profile_path
from tests.support.bench import PROFILE_7B, PROFILE_13B, REPO


def test_shipped_profiles_carry_the_published_numbers_and_their_source():
    p7, p13 = load_profile(PROFILE_7B), load_profile(PROFILE_13B)
    assert "latency_data_decoder.csv" in p7.source and "latency_data_decoder.csv" in p13.source
    assert (p7.batch_size, p7.n_positions, p13.batch_size) == (8, 4096, 8)
    assert p7.vocab_size == p13.vocab_size == 32000  # Llama 2's tokenizer
    assert p7.decode_s(1) == pytest.approx(0.00647) and p7.decode_s(8) == pytest.approx(0.0121)
    assert p13.decode_s(1) == pytest.approx(0.00917) and p13.decode_s(8) == pytest.approx(0.0149)
    # TTFT at 128 input tokens, batch 1 and batch 8
    assert p7.prefill_s(1, 128) == pytest.approx(0.0276) and p7.prefill_s(8, 128) == pytest.approx(0.077)
    assert p13.prefill_s(1, 128) == pytest.approx(0.0259) and p13.prefill_s(8, 128) == pytest.approx(0.109)
    assert p7.ideal_tokens_per_s() == pytest.approx(8 / 0.0121)


def test_decode_is_interpolated_between_published_batch_sizes():
    p = load_profile(PROFILE_7B)
    assert p.decode_s(4) == pytest.approx((6.47 + (12.1 - 6.47) * 3 / 7) / 1000)
    assert p.decode_s(1) < p.decode_s(2) < p.decode_s(7) < p.decode_s(8)


def test_prompts_are_padded_to_their_context_bucket():
    p = load_profile(PROFILE_7B)
    assert p.buckets_for(1) == [64]
    assert p.buckets_for(100) == [128]
    assert p.buckets_for(128) == [128]
    assert p.buckets_for(129) == [256]
    assert p.buckets_for(5000) == [2048, 2048, 2048]  # longer than every bucket: several passes
    assert p.prefill_s(1, 100) == p.prefill_s(1, 128)
    assert p.prefill_s(1, 129) > p.prefill_s(1, 128)


def test_a_bad_profile_names_file_and_key(tmp_path):
    raw = yaml.safe_load(PROFILE_7B.read_text())
    raw["context_buckets"] = [128, 64]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match=r"bad\.yaml.*strictly increasing"):
        load_profile(bad)
    raw = yaml.safe_load(PROFILE_7B.read_text())
    raw["decode_step_ms"] = {1: -1.0}
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ProfileError, match="decode_step_ms"):
        load_profile(bad)
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.yaml")


def test_unknown_profile_keys_are_rejected():
    raw = yaml.safe_load(PROFILE_7B.read_text())
    with pytest.raises(ValueError, match="batchsize"):
        Profile.model_validate({**raw, "batchsize": 4})


def test_a_generated_profile_records_what_it_was_modelled_for():
    raw = yaml.safe_load(PROFILE_7B.read_text())
    assert Profile.model_validate(raw).generated is None  # a profile of published figures
    generated = {
        "by": "scripts/plan/profiles.py",
        "model": "llama-2-7b",
        "tp_degree": 24,
        "weight_dtype": "bf16",
        "prompt_tokens": 128,
        "prompt_spread": 0,
        "output_tokens": 3968,
        "calibration_date": "2026-12-02",
    }
    assert Profile.model_validate({**raw, "generated": generated}).generated.tp_degree == 24
    with pytest.raises(ValueError, match="layout"):
        Profile.model_validate({**raw, "generated": {**generated, "layout": "TP24"}})
    with pytest.raises(ValueError, match="tp_degree"):
        Profile.model_validate({**raw, "generated": {**generated, "tp_degree": 0}})
    with pytest.raises(ValueError, match="calibration_date"):
        Profile.model_validate({**raw, "generated": {k: v for k, v in generated.items() if k != "calibration_date"}})


def test_relative_profile_paths_resolve_against_archive_then_repository(tmp_path):
    rel = "profiles/llama-2-7b-inf2-48xl-tp24.yaml"
    assert resolve_profile_path(rel, tmp_path) == REPO / rel
    (tmp_path / "profiles").mkdir()
    (tmp_path / rel).write_text(PROFILE_7B.read_text())
    assert resolve_profile_path(rel, tmp_path) == tmp_path / rel
    assert resolve_profile_path(str(PROFILE_13B), tmp_path) == PROFILE_13B
