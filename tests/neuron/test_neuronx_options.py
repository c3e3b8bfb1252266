"""`handler.neuronx.neuron_config` and the other settings transformers-neuronx checks:
what the static, left-padded path cannot honour is refused before the SDK loads, and the
SDK's own refusals (NeuronConfig asserts, from_pretrained's sanity checks, constructor
ValueErrors) become a ConfigError naming the key."""

from __future__ import annotations

import json
import sys

import pytest

from handler.config import ConfigError
from handler.neuron import options
from handler.neuron.config import REFUSED_NEURON_CONFIG
from tests.neuron.conftest import calls, neuronx_yaml
from tests.torchserve_harness import run_batch

pytestmark = [
    pytest.mark.usefixtures("fake_neuronx"),
    pytest.mark.filterwarnings("ignore:NeuronConfig `.*` argument is deprecated"),
]

# every keyword that makes the real NeuronConfig come out lhs_aligned (right-padded rows, 2-D cache ids)
RIGHT_ALIGNED = [
    ("padding_side", "right"),
    ("lhs_aligned", True),
    ("use_2d_cache_ids", True),
    ("continuous_batching", True),
]
HARMLESS = {"padding_side": "left", "lhs_aligned": False, "use_2d_cache_ids": False, "continuous_batching": False}


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        *[(key, value, "right-padded rows with 2-D cache ids") for key, value in RIGHT_ALIGNED[:3]],
        ("continuous_batching", True, "continuous batching"),
        ("batch_size_for_shared_caches", 2, "continuous batching"),
        ("max_num_seqs", 2, "continuous batching"),
        ("output_all_logits", True, "[batch, vocab] logits"),
        ("log_softmax_scores", True, "[batch, vocab] logits"),
        ("on_device_generation", True, "samples on the device"),
        ("is_eagle_target", True, "EAGLE"),
        ("is_eagle_draft", True, "EAGLE"),
    ],
)
def test_neuron_config_keys_the_left_padded_path_cannot_honour_fail_initialize(
    checkpoint, start_handler, key, value, why
):
    model_yaml = neuronx_yaml(checkpoint, neuronx={"neuron_config": {"fuse_qkv": True, key: value}})
    with pytest.raises(ConfigError) as info:
        start_handler(model_yaml)
    message = str(info.value)
    assert f"handler.neuronx.neuron_config.{key}: {value!r} is refused" in message and why in message
    assert "fuse_qkv:" not in message  # only the key at fault is named
    assert "transformers_neuronx" not in sys.modules  # refused before the SDK was loaded


@pytest.mark.parametrize(("key", "value"), RIGHT_ALIGNED)
def test_the_refused_keys_are_the_ones_the_sdk_right_aligns(key, value):
    """The refusal list and the SDK's NeuronConfig (mirrored by the fake) agree on what switches
    to right-aligned 2-D cache ids; a fake or a list that drifted from the real logic fails here."""
    from transformers_neuronx import ContinuousBatchingConfig, NeuronConfig

    sdk_value = ContinuousBatchingConfig(max_num_seqs=2) if key == "continuous_batching" else value
    built = NeuronConfig(**{key: sdk_value})
    assert built.lhs_aligned and options.right_aligned(built) is not None
    refused, _ = REFUSED_NEURON_CONFIG[key]
    assert refused(value)
    harmless = NeuronConfig(**{key: HARMLESS[key]})
    assert not harmless.lhs_aligned and options.right_aligned(harmless) is None
    assert not refused(HARMLESS[key])


def test_harmless_values_of_those_keys_are_passed_through(fake_neuronx, checkpoint, start_handler):
    start_handler(neuronx_yaml(checkpoint, neuronx={"neuron_config": HARMLESS}))
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["neuron_config"]["lhs_aligned"] is False and built["neuron_config"]["padding_side"] == "left"


def test_a_right_aligned_neuron_config_is_caught_even_when_the_key_list_misses_it(
    fake_neuronx, checkpoint, start_handler, monkeypatch
):
    """The built NeuronConfig is asked too, so an SDK that right-aligns on a key the list does not
    know is refused before any weights load, naming the key whose removal makes it fit."""
    monkeypatch.delitem(REFUSED_NEURON_CONFIG, "padding_side")
    model_yaml = neuronx_yaml(checkpoint, neuronx={"neuron_config": {"fuse_qkv": True, "padding_side": "right"}})
    with pytest.raises(ConfigError, match=r"handler\.neuronx\.neuron_config\.padding_side: .*lhs_aligned=True"):
        start_handler(model_yaml)
    assert not calls(fake_neuronx, "from_pretrained")


def test_right_aligned_cache_ids_would_corrupt_a_left_padded_batch(checkpoint, start_handler, monkeypatch):
    """Why the refusal exists, shown on the fake: with every guard off, padding_side 'right'
    compiles and serves, and the shorter (left-padded) prompt of a batch comes out different
    from the same batch served left-aligned; the longer, unpadded one is unchanged."""
    rows = [
        {"prompt": "Once upon a time there was a little", "max_new_tokens": 8, "stream": False},
        {"prompt": "Today", "max_new_tokens": 8, "stream": False},
    ]
    handler, context = start_handler(neuronx_yaml(checkpoint))
    left = [json.loads(r.final)["text"] for r in run_batch(handler, context, rows)]
    handler.shutdown()

    monkeypatch.setitem(REFUSED_NEURON_CONFIG, "padding_side", (lambda _value: False, ""))
    monkeypatch.setattr(options, "right_aligned", lambda _config: None)
    handler, context = start_handler(neuronx_yaml(checkpoint, neuronx={"neuron_config": {"padding_side": "right"}}))
    right = [json.loads(r.final)["text"] for r in run_batch(handler, context, rows)]
    assert right[0] == left[0]
    assert right[1] != left[1]


@pytest.mark.parametrize(
    ("change", "key", "sdk_message"),
    [
        ({"neuron_config": {"fuse_qkvv": True}}, "neuron_config.fuse_qkvv", "Unexpected NeuronConfig keyword"),
        ({"neuron_config": {"qkv_tiling": True}}, "neuron_config.qkv_tiling", "QKV weight tiling"),
        ({"neuron_config": {"cast_logits_dtype": "f32"}}, "neuron_config.cast_logits_dtype", "cast_logits_dtype"),
        ({"neuron_config": {"cache_layout": "BSH"}}, "neuron_config.cache_layout", "BSH cache layout can only"),
        (
            {"neuron_config": {"sequence_parallel_norm": True, "sequence_parallel_norm_threshold": 100}, "tp": 3},
            "neuron_config.sequence_parallel_norm",
            "Sequence parallel normalization requires the bucket size (128)",
        ),
    ],
)
def test_sdk_refusals_name_the_key(fake_neuronx, checkpoint, start_handler, change, key, sdk_message):
    """NeuronConfig's asserts (at construction), from_pretrained's _sanity_check (AssertionError)
    and LlamaForSampling's ValueError all end as a ConfigError naming the key; the failed start
    gives its cores back."""
    tp_degree = change.pop("tp", 1)
    model_yaml = neuronx_yaml(checkpoint, tp_degree=tp_degree, neuronx={"num_cores": tp_degree, **change})
    with pytest.raises(ConfigError) as info:
        start_handler(model_yaml)
    message = str(info.value)
    assert message.startswith(f"model-config.yaml: handler.neuronx.{key}: ") and sdk_message in message
    assert not calls(fake_neuronx, "to_neuron")
    start_handler(neuronx_yaml(checkpoint, tp_degree=tp_degree, neuronx={"num_cores": tp_degree}))


@pytest.mark.parametrize("error", [AssertionError("an internal check failed"), ValueError("bad value")])
def test_an_sdk_refusal_that_names_no_key_blames_neuron_config(
    fake_neuronx, checkpoint, start_handler, monkeypatch, error
):
    from transformers_neuronx import base

    def refuse(cls, *args, **kwargs):
        raise error

    monkeypatch.setattr(base.NeuronModelBase, "from_pretrained", classmethod(refuse))
    with pytest.raises(ConfigError) as info:
        start_handler(neuronx_yaml(checkpoint))
    message = str(info.value)
    assert message.startswith("model-config.yaml: handler.neuronx.neuron_config: ")
    assert f"{type(error).__name__}: {error}" in message


@pytest.mark.parametrize(
    ("message", "configured", "expected"),
    [
        # messages as transformers-neuronx 0.13 words them
        ("Unexpected NeuronConfig keyword arguments: {'fuse_qkvv': True}", ["fuse_qkv", "fuse_qkvv"], "fuse_qkvv"),
        ("BSH cache layout can only be configured with continuous batching.", ["cache_layout"], "cache_layout"),
        (
            "sequence_parallel_norm_threshold=0 must be greater than zero",
            ["sequence_parallel_norm", "sequence_parallel_norm_threshold"],
            "sequence_parallel_norm_threshold",
        ),
        ("flash decoding only support SBH layout , got BSH", ["shard_over_sequence"], "shard_over_sequence"),
        ("Max context_length_estimate 512 cannot be more than max n_positions 256.", [], "context_length_estimate"),
        ("something nobody could trace", ["fuse_qkv"], None),
    ],
)
def test_blame_maps_sdk_messages_to_keys(message, configured, expected):
    settings = ["batch_size", "tp_degree", "amp", "n_positions", "context_length_estimate"]
    key = options.blame(message, configured, settings)
    if expected is None:
        assert key == "handler.neuronx.neuron_config"
    elif expected == "context_length_estimate":
        assert key == "handler.neuronx.context_length_estimate"
    else:
        assert key == f"handler.neuronx.neuron_config.{expected}"
