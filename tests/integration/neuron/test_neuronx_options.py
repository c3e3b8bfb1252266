"""`handler.neuronx.neuron_config` and the other settings transformers-neuronx checks: what
the backend owns (continuous batching and the padding it implies) or cannot honour is refused
before the SDK loads, and the SDK's own refusals (NeuronConfig asserts, from_pretrained's
sanity checks, constructor ValueErrors) become a ConfigError naming the key."""

from __future__ import annotations

import sys

import pytest

from handler.errors import ConfigError
from handler.neuron import options
from handler.neuron.config import REFUSED_NEURON_CONFIG
from tests.support.neuron import calls, neuronx_yaml

pytestmark = [
    pytest.mark.usefixtures("fake_neuronx"),
    pytest.mark.filterwarnings("ignore:NeuronConfig `.*` argument is deprecated"),
]

# the keywords from which the real NeuronConfig derives lhs_aligned / padding_side
PADDING_KEYS = [
    ("padding_side", "right"),
    ("padding_side", "left"),
    ("lhs_aligned", True),
    ("lhs_aligned", False),
    ("use_2d_cache_ids", True),
    ("use_2d_cache_ids", False),
]


@pytest.mark.parametrize(
    ("key", "value", "why"),
    [
        ("continuous_batching", True, "configures continuous batching itself"),
        ("continuous_batching", False, "set scheduler.n_slots instead"),
        ("batch_size_for_shared_caches", 2, "ContinuousBatchingConfig(max_num_seqs=scheduler.n_slots)"),
        ("max_num_seqs", 2, "set scheduler.n_slots instead"),
        *[(key, value, "continuous batching fixes the padding") for key, value in PADDING_KEYS],
        ("cache_layout", "BSH", "concatenated 1-D queries"),
        ("output_all_logits", True, "set handler.neuronx.output_all_logits instead"),
        ("output_all_logits", False, "set handler.neuronx.output_all_logits instead"),
        ("log_softmax_scores", True, "[n, vocab] logits"),
        ("on_device_generation", True, "samples on the device"),
        ("is_eagle_target", True, "EAGLE"),
        ("is_eagle_draft", True, "EAGLE"),
    ],
)
def test_neuron_config_keys_the_backend_owns_or_cannot_honour_fail_the_start(
    checkpoint, start_backend, key, value, why
):
    model_yaml = neuronx_yaml(checkpoint, neuronx={"neuron_config": {"fuse_qkv": True, key: value}})
    with pytest.raises(ConfigError) as info:
        start_backend(model_yaml)
    message = str(info.value)
    assert f"handler.neuronx.neuron_config.{key}: {value!r} is refused" in message and why in message
    assert "fuse_qkv:" not in message  # only the key at fault is named
    assert "transformers_neuronx" not in sys.modules  # refused before the SDK was loaded


@pytest.mark.parametrize(("key", "value"), PADDING_KEYS)
def test_under_continuous_batching_the_sdk_overrides_the_padding_keys(key, value):
    """Why every value of the padding keys is refused: with continuous batching the SDK's NeuronConfig
    (mirrored by the fake) comes out right-padded with 2-D cache ids whatever they say, so 'left' or
    False would be silently ignored and 'right' or True say nothing."""
    from transformers_neuronx import ContinuousBatchingConfig, NeuronConfig

    built = NeuronConfig(continuous_batching=ContinuousBatchingConfig(max_num_seqs=2), **{key: value})
    assert built.lhs_aligned is True and built.padding_side == "right"
    assert options.continuous_batching_problem(built) is None
    refused, _ = REFUSED_NEURON_CONFIG[key]
    assert refused(value)


def test_the_sdk_refuses_bsh_under_continuous_batching_without_naming_it(checkpoint, monkeypatch, tmp_path):
    """Why cache_layout BSH is refused up front: with the n_positions this backend passes (an int) the
    SDK's sanity check fails on a bare assert that names nothing."""
    from transformers_neuronx import ContinuousBatchingConfig, LlamaForSampling, NeuronConfig

    neuron_config = NeuronConfig(continuous_batching=ContinuousBatchingConfig(max_num_seqs=2), cache_layout="BSH")
    with pytest.raises(AssertionError) as info:
        LlamaForSampling.from_pretrained(str(checkpoint), batch_size=2, n_positions=256, neuron_config=neuron_config)
    assert str(info.value) == ""
    assert not REFUSED_NEURON_CONFIG["cache_layout"][0]("SBH")


def test_the_sdk_checks_batch_size_against_max_num_seqs(checkpoint):
    """The sanity check the backend satisfies by passing batch_size = max_num_seqs = n_slots."""
    from transformers_neuronx import ContinuousBatchingConfig, LlamaForSampling, NeuronConfig

    neuron_config = NeuronConfig(continuous_batching=ContinuousBatchingConfig(max_num_seqs=4))
    with pytest.raises(AssertionError, match=r"invalid batch_size_for_shared_caches \(4\), 2 is expected"):
        LlamaForSampling.from_pretrained(str(checkpoint), batch_size=2, n_positions=256, neuron_config=neuron_config)
    with pytest.raises(KeyError):
        ContinuousBatchingConfig(max_model_len=256)  # no number of sequences
    with pytest.raises(AssertionError, match="unexpected key word arguments"):
        ContinuousBatchingConfig(max_num_seqs=2, block_size=8)
    with pytest.raises(AssertionError, match="chunked prefill is only supported with optimized paged attention"):
        ContinuousBatchingConfig(max_num_seqs=2, enable_chunked_prefill=True)


def test_harmless_neuron_config_options_are_passed_through(fake_neuronx, checkpoint, start_backend):
    start_backend(neuronx_yaml(checkpoint, neuronx={"neuron_config": {"cache_layout": "SBH", "fuse_qkv": True}}))
    [built] = calls(fake_neuronx, "from_pretrained")
    assert built["neuron_config"]["cache_layout"] == "SBH" and built["neuron_config"]["fuse_qkv"] is True


def test_an_sdk_that_does_not_right_align_continuous_batching_fails_the_start(
    fake_neuronx, checkpoint, start_backend, monkeypatch
):
    """The built NeuronConfig is asked too: a release whose continuous batching is not right-padded
    with 2-D cache ids would read the backend's rows wrongly, so the start fails before weights load."""
    import transformers_neuronx

    class LeftAligned(transformers_neuronx.NeuronConfig):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.lhs_aligned = False

    monkeypatch.setattr(transformers_neuronx, "NeuronConfig", LeftAligned)
    with pytest.raises(ConfigError, match=r"handler\.neuronx\.neuron_config: .*comes out with lhs_aligned=False"):
        start_backend(neuronx_yaml(checkpoint))
    assert not calls(fake_neuronx, "from_pretrained")


def test_a_continuous_batching_config_the_sdk_refuses_names_n_slots(
    fake_neuronx, checkpoint, start_backend, monkeypatch
):
    """An older release spelled max_num_seqs batch_size_for_shared_caches only."""
    import transformers_neuronx

    def old_spelling(**kwargs):
        assert "max_num_seqs" not in kwargs, f"unexpected key word arguments: {kwargs.keys()}"

    monkeypatch.setattr(transformers_neuronx, "ContinuousBatchingConfig", old_spelling)
    with pytest.raises(
        ConfigError, match=r"^model-config.yaml: scheduler\.n_slots: .*ContinuousBatchingConfig refused"
    ):
        start_backend(neuronx_yaml(checkpoint))


@pytest.mark.parametrize(
    ("change", "key", "sdk_message"),
    [
        ({"neuron_config": {"fuse_qkvv": True}}, "neuron_config.fuse_qkvv", "Unexpected NeuronConfig keyword"),
        ({"neuron_config": {"qkv_tiling": True}}, "neuron_config.qkv_tiling", "QKV weight tiling"),
        ({"neuron_config": {"cast_logits_dtype": "f32"}}, "neuron_config.cast_logits_dtype", "cast_logits_dtype"),
        (
            {"neuron_config": {"sequence_parallel_norm": True, "sequence_parallel_norm_threshold": 100}, "tp": 3},
            "neuron_config.sequence_parallel_norm",
            "Sequence parallel normalization requires the bucket size (128)",
        ),
    ],
)
def test_sdk_refusals_name_the_key(fake_neuronx, checkpoint, start_backend, change, key, sdk_message):
    """NeuronConfig's asserts (at construction), from_pretrained's _sanity_check (AssertionError)
    and LlamaForSampling's ValueError all end as a ConfigError naming the key; the failed start
    gives its cores back."""
    tp_degree = change.pop("tp", 1)
    model_yaml = neuronx_yaml(checkpoint, tp_degree=tp_degree, neuronx={"num_cores": tp_degree, **change})
    with pytest.raises(ConfigError) as info:
        start_backend(model_yaml)
    message = str(info.value)
    assert message.startswith(f"model-config.yaml: handler.neuronx.{key}: ") and sdk_message in message
    assert not calls(fake_neuronx, "to_neuron")
    start_backend(neuronx_yaml(checkpoint, tp_degree=tp_degree, neuronx={"num_cores": tp_degree}))


@pytest.mark.parametrize("error", [AssertionError("an internal check failed"), ValueError("bad value")])
def test_an_sdk_refusal_that_names_no_key_blames_neuron_config(
    fake_neuronx, checkpoint, start_backend, monkeypatch, error
):
    from transformers_neuronx import base

    def refuse(cls, *args, **kwargs):
        raise error

    monkeypatch.setattr(base.NeuronModelBase, "from_pretrained", classmethod(refuse))
    with pytest.raises(ConfigError) as info:
        start_backend(neuronx_yaml(checkpoint))
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
