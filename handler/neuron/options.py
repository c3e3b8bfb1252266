"""NeuronConfig from `handler.neuronx` (with the backend's continuous batching), and which
model-config.yaml key a refusal of transformers-neuronx comes from.

transformers-neuronx checks its settings with bare `assert`s and a few ValueErrors
(NeuronConfig's own checks, `PretrainedModel.from_pretrained`'s `_sanity_check`, the model
constructors), whose messages name a keyword, or only describe it ("BSH cache layout can
only be configured with continuous batching"). `blame` maps such a message back to the key
the operator wrote; what cannot be traced is put on `handler.neuronx.neuron_config`.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from handler.errors import ConfigError
from handler.neuron.config import NEURON_CONFIG_KEY

SDK_ERRORS = (AssertionError, NotImplementedError, TypeError, ValueError)

# NeuronConfig keywords the backend fills from keys of its own
DERIVED_OPTIONS = {
    "group_query_attention": "handler.neuronx.group_query_attention",
    "quant": "handler.neuronx.quantize_weights",
    "continuous_batching": "scheduler.n_slots",
    "output_all_logits": "handler.neuronx.output_all_logits",
}
# from_pretrained keywords -> model-config.yaml keys
MODEL_SETTINGS = {
    "context_length_estimate": "handler.neuronx.context_length_estimate",
    "n_positions": "handler.n_positions",
    "batch_size": "scheduler.n_slots",
    "tp_degree": "handler.tp_degree",
    "amp": "handler.amp",
}
# how transformers-neuronx's messages describe options they do not spell out
PHRASES = {
    "cache_layout": ("cache layout",),
    "sequence_parallel_norm": ("sequence parallel normalization",),
    "qkv_tiling": ("qkv weight tiling",),
    "shard_over_sequence": ("flash decoding", "kv_shard"),
    "group_query_attention": ("gqa", "shard-over", "replicated-heads", "all-gather-heads"),
}


def option_key(option: str) -> str:
    """The model-config.yaml key behind a NeuronConfig keyword the backend passes."""
    return DERIVED_OPTIONS.get(option, f"{NEURON_CONFIG_KEY}.{option}")


def _names(message: str, name: str) -> bool:
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])", message, re.IGNORECASE) is not None


def mentioned_option(message: str, options: Iterable[str]) -> str | None:
    """The NeuronConfig keyword `message` is about: named outright (longest name first), else described."""
    candidates = sorted(options, key=len, reverse=True)
    for option in candidates:
        if _names(message, option):
            return option
    lowered = message.lower()
    for option in candidates:
        if any(phrase in lowered for phrase in PHRASES.get(option, ())):
            return option
    return None


def blame(message: str, options: Iterable[str], settings: Iterable[str] = ()) -> str:
    """The model-config.yaml key a transformers-neuronx error message points at."""
    option = mentioned_option(message, options)
    if option is not None:
        return option_key(option)
    given = set(settings)
    for setting, key in MODEL_SETTINGS.items():  # most specific first: "context_length_estimate ... n_positions"
        if setting in given and _names(message, setting):
            return key
    return NEURON_CONFIG_KEY


def culprit(options: Mapping[str, Any], fits: Callable[[dict[str, Any]], bool]) -> str | None:
    """The one option without which `fits` holds, when there is exactly one such."""
    found = [key for key in options if fits({k: v for k, v in options.items() if k != key})]
    return found[0] if len(found) == 1 else None


def continuous_batching_problem(neuron_config: Any) -> str | None:
    """What in a built NeuronConfig keeps the SDK from continuous batching with right-padded rows and
    2-D cache ids (what the backend sends), or None. transformers-neuronx 0.13 forces lhs_aligned and
    padding_side 'right' whenever continuous_batching is set (config.py, NeuronConfig.__init__); asked
    of the object itself, so a release that derives them differently fails the start instead of
    answering with corrupt text."""
    if not getattr(neuron_config, "continuous_batching", None):
        return "no continuous_batching"
    if not getattr(neuron_config, "lhs_aligned", False):
        return "lhs_aligned=False"
    side = getattr(neuron_config, "padding_side", "right")
    if side != "right":
        return f"padding_side={side!r}"
    return None


def build(neuron_config_cls: Callable[..., Any], options: dict[str, Any]) -> Any:
    """NeuronConfig(**options), or a ConfigError naming the key it refused; the result must serve
    continuous batching (`continuous_batching_problem`)."""
    try:
        built = neuron_config_cls(**options)
    except SDK_ERRORS as exc:
        key = _refused_key(neuron_config_cls, options, exc)
        raise ConfigError(
            f"model-config.yaml: {key}: transformers-neuronx's NeuronConfig refused {_shown(options)}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    problem = continuous_batching_problem(built)
    if problem is not None:
        raise ConfigError(
            f"model-config.yaml: {NEURON_CONFIG_KEY}: the NeuronConfig built from {_shown(options)} comes out with "
            f"{problem}: this transformers-neuronx does not run continuous batching with right-padded rows and 2-D "
            "cache ids as 0.13 does, and this backend sends nothing else; install the SDK 2.25 pins "
            "(requirements-neuron.txt)"
        )
    return built


def _shown(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as the operator would recognise them (the SDK's config objects by their settings)."""

    def shown(value: Any) -> Any:
        if isinstance(value, enum.Enum):
            return value.value
        return vars(value) if hasattr(value, "__dict__") else value

    return {key: shown(value) for key, value in options.items()}


def _refused_key(neuron_config_cls: Callable[..., Any], options: dict[str, Any], exc: BaseException) -> str:
    option = mentioned_option(str(exc), options)
    if option is None:
        option = culprit(options, lambda subset: _try(neuron_config_cls, subset) is not None)
    return option_key(option) if option else NEURON_CONFIG_KEY


def _try(neuron_config_cls: Callable[..., Any], options: dict[str, Any]) -> Any | None:
    try:
        return neuron_config_cls(**options)
    except SDK_ERRORS:
        return None
