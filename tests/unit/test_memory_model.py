"""The memory model (handler/neuron/memory.py) against hand-computed cases.

Every expected number is written out from the arithmetic, in the units the model uses: weights
per NeuronCore = (each sharded matrix's elements / tp_degree, over the SDK's padded sizes, + the
replicated norms) x bytes per element; KV per core = 2 (K, V) x layers x kv heads per core x
head_dim x n_slots x n_positions x 2 bytes (bf16). 1 GiB = 2**30 bytes. The configs are the
real config.json files of the three models (tests/fixtures/configs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from handler.backends.memory_fit import check_memory_fit, nxdi_lora_layout
from handler.errors import ConfigError
from handler.neuron.lora import LoraSettings
from handler.neuron.memory import (
    GIB,
    HBM_PER_CORE_GIB,
    RUNTIME_RESERVE_GIB,
    Layout,
    LoraLayout,
    ModelShape,
    estimate,
    fit_problem,
    valid_tp_degrees,
)

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "configs"


@pytest.fixture(scope="module")
def llama2_7b() -> ModelShape:
    return ModelShape.from_path(CONFIGS / "llama-2-7b.json")


@pytest.fixture(scope="module")
def llama31_8b() -> ModelShape:
    return ModelShape.from_path(CONFIGS / "llama-3.1-8b.json")


@pytest.fixture(scope="module")
def llama2_70b() -> ModelShape:
    return ModelShape.from_path(CONFIGS / "llama-2-70b.json")


def gib(n_bytes: float) -> float:
    return n_bytes / GIB


# -- the shapes -----------------------------------------------------------------------------


def test_shapes_from_the_real_configs(llama2_7b, llama31_8b, llama2_70b):
    assert llama2_7b == ModelShape("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096, False)
    assert llama31_8b == ModelShape("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072, False)
    assert llama2_70b == ModelShape("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096, False)


def test_parameter_counts_are_the_published_ones(llama2_7b, llama31_8b, llama2_70b):
    # 7B: embeddings 2 x 32000 x 4096 = 262,144,000 x 2; per layer q,k,v,o 4 x 4096^2 = 67,108,864 +
    # MLP 3 x 4096 x 11008 = 135,266,304 + 2 norms 8192; x 32 layers; + the final norm 4096
    assert llama2_7b.parameters() == 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
    assert llama2_7b.parameters() == 6_738_415_616  # "6.74B"
    # 8B: k and v are 8 heads x 128 = 1024 wide
    per_layer = 2 * 4096**2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert llama31_8b.parameters() == 2 * 128256 * 4096 + 32 * per_layer + 4096 == 8_030_261_248  # "8.03B"
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert llama2_70b.parameters() == 2 * 32000 * 8192 + 80 * per_layer + 8192 == 68_976_648_192  # "68.98B"


def test_from_path_reads_a_checkpoint_directory_and_head_dim(tmp_path):
    config = json.loads((CONFIGS / "llama-2-7b.json").read_text())
    checkpoint = tmp_path / "My-Model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({**config, "head_dim": 64}))
    shape = ModelShape.from_path(checkpoint)
    assert (shape.name, shape.head_dim) == ("My-Model", 64)  # the head_dim key wins over hidden // heads
    assert ModelShape.from_config(config).name == "meta-llama/Llama-2-7b-hf"  # _name_or_path
    without_kv = {k: v for k, v in config.items() if k != "num_key_value_heads"}
    assert ModelShape.from_config(without_kv, "x").kv_heads == 32  # MHA when the key is absent


def test_a_config_without_a_needed_key_is_refused_naming_it(tmp_path):
    config = json.loads((CONFIGS / "llama-2-7b.json").read_text())
    del config["intermediate_size"]
    with pytest.raises(ConfigError, match=r"intermediate_size is None"):
        ModelShape.from_config(config, "broken")
    with pytest.raises(ConfigError, match="cannot read"):
        ModelShape.from_path(tmp_path / "missing.json")
    moe = json.loads((CONFIGS / "llama-2-7b.json").read_text()) | {"num_local_experts": 8}
    with pytest.raises(ConfigError, match="a mixture of 8 experts; the memory model covers dense"):
        ModelShape.from_config(moe, "mixtral")


# -- Llama-2-7B bf16 (MHA, 32 heads) at tp 2 / 8 / 24, 4 slots x 4096 positions --------------------

NORMS_7B = (2 * 32 + 1) * 4096  # 266,240 norm weights, on every core


def test_llama2_7b_tp2(llama2_7b):
    found = estimate(llama2_7b, Layout(tp_degree=2, n_slots=4, n_positions=4096))
    # 2 divides the 32 heads, 11008 and 32000: no padding; everything but the norms halves
    weights = ((6_738_415_616 - NORMS_7B) / 2 + NORMS_7B) * 2  # = 6,738,681,856 bytes
    assert found.weights_gib == pytest.approx(gib(weights)) == pytest.approx(6.2759, abs=1e-4)
    # 32 kv heads / 2 = 16 per core: 2 x 32 x 16 x 128 x 4 x 4096 x 2 bytes = 4 GiB
    assert (found.padded_heads, found.kv_heads_per_core) == (32, 16)
    assert found.kv_gib == gib(2 * 32 * 16 * 128 * 4 * 4096 * 2) == 4.0
    assert found.reserve_gib == RUNTIME_RESERVE_GIB
    assert found.total_gib == pytest.approx(6.2759 + 4.0 + 1.0, abs=1e-4) and found.fits and not found.near_limit


def test_llama2_7b_tp8(llama2_7b):
    found = estimate(llama2_7b, Layout(tp_degree=8, n_slots=4, n_positions=4096))
    weights = ((6_738_415_616 - NORMS_7B) / 8 + NORMS_7B) * 2  # = 1,685,069,824 bytes
    assert found.weights_gib == pytest.approx(gib(weights)) == pytest.approx(1.5693, abs=1e-4)
    assert found.kv_gib == gib(2 * 32 * 4 * 128 * 4 * 4096 * 2) == 1.0  # 4 kv heads per core


def test_llama2_7b_tp24_pads_heads_mlp_and_vocabulary(llama2_7b):
    found = estimate(llama2_7b, Layout(tp_degree=24, n_slots=4, n_positions=4096))
    # 32 heads -> 48 (a multiple of 24: 2 per core), and K and V with them (MHA);
    # intermediate 11008 -> 11016 (459 per core); vocabulary 32000 -> 32016 (1334 per core)
    assert (found.padded_heads, found.padded_kv_heads, found.kv_heads_per_core) == (48, 48, 2)
    attention = 4096 * 128 * (2 + 2 + 2 + 2)  # q, k, v, o: 2 heads each per core
    mlp = 3 * 4096 * 459
    per_core = 32 * (attention + mlp) + 2 * 1334 * 4096 + NORMS_7B  # = 325,898,240 weights
    assert found.weights_gib == pytest.approx(gib(per_core * 2)) == pytest.approx(0.6070, abs=1e-4)
    assert found.kv_gib == gib(2 * 32 * 2 * 128 * 4 * 4096 * 2) == 0.5
    # the padding costs: without it the share would be 6,738,149,376 / 24 + norms
    assert found.weights_gib > gib(((6_738_415_616 - NORMS_7B) / 24 + NORMS_7B) * 2)


def test_int8_weights_halve_the_layer_matrices_only(llama2_7b):
    found = estimate(llama2_7b, Layout(tp_degree=8, n_slots=4, n_positions=4096, weight_dtype="int8"))
    layers = 32 * (4 * 4096**2 + 3 * 4096 * 11008) / 8 * 1  # 1 byte per quantized weight
    embeddings = 2 * 32000 * 4096 / 8 * 2  # embedding and lm_head stay bf16
    norms = NORMS_7B * 2
    assert found.weights_gib == pytest.approx(gib(layers + embeddings + norms)) == pytest.approx(0.8154, abs=1e-4)
    assert found.kv_gib == 1.0  # the KV cache keeps its dtype
    # under amp f32 (the handler's default amp) the unquantized parameters and the KV are 4 bytes
    f32 = estimate(llama2_7b, Layout(8, 4, 4096, weight_dtype="int8", kv_dtype="f32"))
    assert f32.weights_gib == pytest.approx(gib(layers + 2 * embeddings + 2 * norms))
    assert f32.kv_gib == 2.0


def test_near_limit(llama2_7b):
    """7B at tp 2 with 8 slots x 4096: 6.28 + 8 + 1 = 15.28 GiB, above 95 % of 16 (15.2): fits, with a warning."""
    found = estimate(llama2_7b, Layout(tp_degree=2, n_slots=8, n_positions=4096))
    assert found.total_gib == pytest.approx(15.276, abs=1e-3)
    assert found.fits and found.near_limit
    assert fit_problem(llama2_7b, Layout(tp_degree=2, n_slots=8, n_positions=4096)) is None


# -- GQA: Llama-3.1-8B, 32 heads, 8 kv heads ----------------------------------------------------


def test_gqa_kv_heads_fewer_than_tp_are_replicated_one_per_core(llama31_8b):
    found = estimate(llama31_8b, Layout(tp_degree=24, n_slots=4, n_positions=4096))
    # Q: 32 -> 48. KV: 8 % 24 != 0, so transformers-neuronx falls back to replicated-heads, and
    # as 24 is a multiple of 8 each kv head is copied 3 times: 24 kv heads, one per core
    # (NxDI: REPLICATE_TO_TP_DEGREE, the same)
    assert (found.padded_heads, found.padded_kv_heads, found.kv_heads_per_core) == (48, 24, 1)
    assert found.kv_gib == gib(2 * 32 * 1 * 128 * 4 * 4096 * 2) == 0.25
    # weights: q and o 2 heads per core, k and v 1 (the copies are real); MLP 14336 -> 14352 (598 per
    # core); vocabulary 128256 = 24 x 5344, no padding
    attention = 4096 * 128 * (2 + 1 + 1 + 2)
    mlp = 3 * 4096 * 598
    per_core = 32 * (attention + mlp) + 2 * 5344 * 4096 + NORMS_7B
    assert found.weights_gib == pytest.approx(gib(per_core * 2)) == pytest.approx(0.7075, abs=1e-4)


@pytest.mark.parametrize(
    ("tp", "kv_padded", "per_core"),
    [
        (2, 8, 4),  # 8 kv heads shard over the heads: 4 per core
        (8, 8, 1),  # one each
        (12, 36, 3),  # 12 is not a multiple of 8: replicated up to the 36 padded Q heads, 3 per core
    ],
)
def test_gqa_kv_heads_per_core_follow_the_sdk(llama31_8b, tp, kv_padded, per_core):
    """tp 12 is the case where a naive max(kv / tp, 1) = 1 would be 3 times too small: both SDKs
    turn the model into MHA there (transformers-neuronx get_qkv_padding, NxDI CONVERT_TO_MHA)."""
    for sdk in ("neuronx", "nxdi"):
        found = estimate(llama31_8b, Layout(tp_degree=tp, n_slots=4, n_positions=4096, sdk=sdk))
        assert (found.padded_kv_heads, found.kv_heads_per_core) == (kv_padded, per_core), sdk
        assert found.kv_gib == gib(2 * 32 * per_core * 128 * 4 * 4096 * 2)


def test_where_the_two_sdks_differ():
    """72 heads, 24 kv heads at tp 32, the example in transformers-neuronx's get_qkv_padding: there
    one kv head per core (no replication, padded to tp: 32); NxDI converts to MHA (96 heads, 3 per core)."""
    shape = ModelShape("x", 1, 72 * 128, 72, 24, 128, 1024, 32000, 4096, False)
    neuronx = estimate(shape, Layout(tp_degree=32, n_slots=1, n_positions=128))
    nxdi = estimate(shape, Layout(tp_degree=32, n_slots=1, n_positions=128, sdk="nxdi"))
    assert (neuronx.padded_heads, neuronx.padded_kv_heads, neuronx.kv_heads_per_core) == (96, 32, 1)
    assert (nxdi.padded_heads, nxdi.padded_kv_heads, nxdi.kv_heads_per_core) == (96, 96, 3)


def test_neuronx_shard_over_batch_splits_the_slots(llama31_8b):
    """shard-over-batch holds every kv head for n_slots / tp of the slots; with slots tp does not
    divide the SDK falls back (to replicated-heads at tp 24)."""
    split = estimate(llama31_8b, Layout(tp_degree=24, n_slots=24, n_positions=4096, gqa="shard-over-batch"))
    assert split.kv_heads_per_core == pytest.approx(8 / 24)
    assert split.kv_gib == pytest.approx(gib(2 * 32 * 8 * 128 * (24 // 24) * 4096 * 2))  # 8 heads, 1 slot per core
    fallback = estimate(llama31_8b, Layout(tp_degree=24, n_slots=8, n_positions=4096, gqa="shard-over-batch"))
    assert fallback.kv_heads_per_core == 1


# -- Llama-2-70B: what fits, and the message -------------------------------------------------------


def test_llama2_70b_at_tp12_does_not_fit_and_says_what_would(llama2_70b):
    layout = Layout(tp_degree=12, n_slots=4, n_positions=4096)
    found = estimate(llama2_70b, layout)
    # Q: 64 -> 72 (6 per core). KV: 12 is not a multiple of 8, so the 8 kv heads become MHA: 72, 6 per core.
    assert (found.padded_heads, found.padded_kv_heads, found.kv_heads_per_core) == (72, 72, 6)
    # weights: q, k, v, o 6 heads each per core; MLP 28672 -> 28680 (2390 per core); vocabulary
    # 32000 -> 32004 (2667 per core); 161 norms of 8192
    per_core = 80 * (8192 * 128 * 24 + 3 * 8192 * 2390) + 2 * 2667 * 8192 + 161 * 8192
    assert found.weights_gib == pytest.approx(gib(per_core * 2)) == pytest.approx(12.586, abs=1e-3)
    assert found.kv_gib == gib(2 * 80 * 6 * 128 * 4 * 4096 * 2) == 3.75
    assert found.total_gib == pytest.approx(12.586 + 3.75 + 1.0, abs=1e-3)
    assert found.total_gib > HBM_PER_CORE_GIB
    assert not found.fits
    problem = fit_problem(llama2_70b, layout)
    assert problem is not None
    assert problem.startswith(
        "llama-2-70b bf16 at tp_degree 12, 4 slot(s) x 4096 positions: 12.6 GiB weights + 3.8 GiB KV + "
        "1.0 GiB reserve = 17.3 GiB per NeuronCore > 16 GiB HBM"
    )
    # tp 24 fits (below); 2 slots: 12.586 + 1.875 + 1 = 15.46 fits, 3: 12.586 + 2.8125 + 1 = 16.40 does not;
    # int8 weights alone: about half the weights
    assert problem.endswith("; try tp_degree 24 or n_slots 2 or int8 weights")


def test_llama2_70b_at_tp24_fits(llama2_70b):
    """The arithmetic says tp 24 fits, with room: Q 64 -> 72 (3 per core), KV 8 -> 24 (one per core,
    24 is a multiple of 8); MLP 28672 -> 28680 (1195 per core); vocabulary 32000 -> 32016 (1334)."""
    found = estimate(llama2_70b, Layout(tp_degree=24, n_slots=8, n_positions=4096))
    assert (found.padded_heads, found.padded_kv_heads, found.kv_heads_per_core) == (72, 24, 1)
    per_core = 80 * (8192 * 128 * (3 + 1 + 1 + 3) + 3 * 8192 * 1195) + 2 * 1334 * 8192 + 161 * 8192
    assert found.weights_gib == pytest.approx(gib(per_core * 2)) == pytest.approx(5.669, abs=1e-3)
    assert found.kv_gib == gib(2 * 80 * 1 * 128 * 8 * 4096 * 2) == 1.25
    assert found.fits and not found.near_limit
    assert fit_problem(llama2_70b, Layout(tp_degree=24, n_slots=8, n_positions=4096)) is None


def test_with_one_slot_too_many_the_advice_is_fewer_positions(llama2_70b):
    """tp 12 with a single slot of 16384 positions: KV 2 x 80 x 6 x 128 x 16384 x 2 = 3.75 GiB -> 17.3 GiB;
    no fewer slots exist, so the advice is the most positions one slot can have: (16 - 1 - 12.586) /
    (2 x 80 x 6 x 128 x 2 bytes per position) = 10,545 positions, 10,496 as a multiple of 128."""
    problem = fit_problem(llama2_70b, Layout(tp_degree=12, n_slots=1, n_positions=16384))
    assert problem is not None and "try tp_degree 24 or n_positions 10496 with n_slots 1" in problem


def test_nothing_fits_on_too_few_cores(llama2_70b):
    problem = fit_problem(llama2_70b, Layout(tp_degree=2, n_slots=8, n_positions=4096), degrees=(1, 2))
    assert problem is not None
    assert "64.2 GiB weights" in problem and "use a larger instance" in problem


def test_valid_tp_degrees():
    assert valid_tp_degrees(1) == [1]
    assert valid_tp_degrees(2) == [1, 2]  # inf2.xlarge / 8xlarge
    assert valid_tp_degrees(12) == [1, 2, 4, 8, 12]  # inf2.24xlarge
    assert valid_tp_degrees(24) == [1, 2, 4, 8, 12, 24]  # inf2.48xlarge


def test_host_ram_to_shard_the_checkpoint(llama2_7b, llama31_8b):
    """bf16 checkpoint x 1.2: 8B needs more than an inf2.xlarge's 16 GiB, 7B less."""
    assert estimate(llama31_8b, Layout(1, 1, 128)).host_shard_gib == pytest.approx(8_030_261_248 * 2 * 1.2 / GIB)
    assert (
        estimate(llama31_8b, Layout(1, 1, 128)).host_shard_gib
        > 16
        > estimate(llama2_7b, Layout(1, 1, 128)).host_shard_gib
    )


def test_a_bad_layout_is_refused():
    with pytest.raises(ConfigError, match="weight_dtype 'int4'"):
        Layout(1, 1, 128, weight_dtype="int4")
    with pytest.raises(ConfigError, match="tp_degree must be at least 1"):
        Layout(0, 1, 128)


# -- NxD Inference's LoRA adapters in device memory (Layout.lora) ---------------------------------------

# One Llama-3.1-8B adapter at rank 16 over q, k, v, o, gate, up, down: rank x (in + out) per projection,
# q 4096+4096, k and v 4096+1024, o 4096+4096, gate and up 4096+14336, down 14336+4096 = 81,920 per layer
ADAPTER_8B_R16 = 16 * 81_920 * 32  # 41,943,040 parameters
# One slot's row at tp 2 (the sharded-linear side whole): q, k, v, gate, up hold lora_A whole (5 x 4096) and
# lora_B halved ((4096 + 1024 + 1024 + 14336 + 14336) / 2); o and down lora_A halved ((4096 + 14336) / 2),
# lora_B whole (2 x 4096)
SLOT_ROW_8B_TP2 = 20_480 + 17_408 + 9_216 + 8_192  # 55,296 per layer and rank


def test_one_adapter_place_is_the_adapters_bf16_weights_split_over_the_cores(llama31_8b):
    """The SDK 2.28 guide's "about 170 MB" per Llama-3.1-8B rank-16 adapter is its f32 size (167.8 MB,
    the file PEFT saves from an f32 run); the device holds it in the amp, bf16: 83.9 MB, split over the cores."""
    assert ADAPTER_8B_R16 * 4 == 167_772_160 and ADAPTER_8B_R16 * 2 == 83_886_080
    for tp in (1, 2, 8):
        one, two = (
            estimate(llama31_8b, Layout(tp, 4, 4096, sdk="nxdi", lora=LoraLayout(places, 16))) for places in (1, 2)
        )
        assert (two.lora_gib - one.lora_gib) * GIB == pytest.approx(ADAPTER_8B_R16 * 2 / tp)


def test_lora_at_tp2_adapters_and_slot_rows(llama31_8b):
    """2 adapters and the base adapter (3 places), 4 slots: 3 x 41.9 M / 2 + 4 x 16 x 55,296 x 32, in bf16."""
    found = estimate(llama31_8b, Layout(2, 4, 4096, sdk="nxdi", lora=LoraLayout(3, 16)))
    lora = (3 * ADAPTER_8B_R16 / 2 + 4 * 16 * SLOT_ROW_8B_TP2 * 32) * 2
    assert found.lora_gib * GIB == lora == 352_321_536
    bare = estimate(llama31_8b, Layout(2, 4, 4096, sdk="nxdi"))
    assert bare.lora_gib == 0 and found.total_gib == pytest.approx(bare.total_gib + gib(lora))
    assert " 1.0 GiB KV + 0.3 GiB LoRA + 1.0 GiB reserve = 9.8 GiB" in found.explain()
    assert "LoRA" not in bare.explain()


def test_lora_pads_with_the_heads_and_the_mlp(llama31_8b):
    """tp 24: q over 48 heads, k and v over 24 (replicated), the MLP over 14352: one place, one slot."""
    found = estimate(llama31_8b, Layout(24, 1, 4096, sdk="nxdi", lora=LoraLayout(1, 16)))
    q, kv, mlp = 48 * 128, 24 * 128, 14_352
    place = (2 * (4096 + q) + 2 * (4096 + kv) + 3 * (4096 + mlp)) / 24
    slot_row = 5 * 4096 + (q + 2 * kv + 2 * mlp) / 24 + (q + mlp) / 24 + 2 * 4096
    assert found.lora_gib * GIB == pytest.approx(16 * 32 * (place + slot_row) * 2)


def test_many_high_rank_adapters_do_not_fit_and_the_advice_counts_them(llama31_8b):
    """40 adapters of rank 64 at tp 2 with 8 slots: 8.1 GiB of LoRA over a layout that fits without them."""
    layout = Layout(2, 8, 4096, sdk="nxdi", lora=LoraLayout(41, 64))
    assert fit_problem(llama31_8b, dataclasses.replace(layout, lora=None)) is None
    problem = fit_problem(llama31_8b, layout)
    assert problem is not None
    assert "2.0 GiB KV + 8.1 GiB LoRA + 1.0 GiB reserve = 18.6 GiB per NeuronCore > 16 GiB HBM" in problem
    assert problem.endswith("; try tp_degree 4 or n_slots 2 or int8 weights")  # tp 4: 10.2 GiB


def test_lora_is_nxdis_and_needs_a_place_and_a_rank():
    with pytest.raises(ConfigError, match="sdk nxdi"):
        Layout(2, 4, 4096, lora=LoraLayout(2, 16))
    with pytest.raises(ConfigError, match="at least 1 adapter place"):
        LoraLayout(0, 16)


@pytest.mark.parametrize(("dynamic", "places"), [(False, 4), (True, 3)])
def test_the_nxdi_adapters_in_device_memory(dynamic, places):
    """3 adapters, max_loras 2: all of them and the base adapter without dynamic multi-LoRA (NxDI raises
    max_loras to the checkpoints), max_loras and the base with it (the rest in host memory)."""
    settings = LoraSettings.of({"a": "/a", "b": "/b", "c": "/c"}, max_loras=2, max_lora_rank=32)
    assert nxdi_lora_layout(settings, dynamic) == LoraLayout(places, 32)
    assert nxdi_lora_layout(None, dynamic) is None


def test_the_memory_check_names_the_lora_keys():
    with pytest.raises(ConfigError) as info:
        check_memory_fit("nxdi", CONFIGS / "llama-3.1-8b.json", Layout(2, 8, 4096, sdk="nxdi", lora=LoraLayout(41, 64)))
    message = str(info.value)
    assert "8.1 GiB LoRA" in message and "handler.lora.max_lora_rank" in message
    assert "handler.nxdi.dynamic_multi_lora" in message and "handler.nxdi.memory_check: false" in message
