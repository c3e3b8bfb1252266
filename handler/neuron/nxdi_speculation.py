"""EAGLE speculative decoding with NxD Inference's fused speculation, SDK-free: the keywords the nxdi
backend compiles with, the positions it may serve, the draft checkpoint's checks, and how a fused
decode call's outputs become each row's accepted tokens. Imports no config and no SDK: the backend
passes plain values.

Read at the SDK 2.28 release commit cd3abf3 of aws-neuron/neuronx-distributed-inference (NxDI
0.8.16251; the repository's tags stop at v0.7.14366) unless another commit is named:

- Keywords (models/config.py:243-256): `speculation_length`, `enable_fused_speculation`,
  `enable_eagle_speculation` (which turns fused speculation on itself, 255-256), `is_eagle3`
  (248; from SDK 2.27, fcb5a86 config.py:231), `is_eagle_draft` (249).
  `trace_tokengen_model` is no keyword any more: it is derived from the others (730-740) and a
  keyword of that name is only logged as unexpected (604-605), so it is not sent.
- The draft (inference_demo.py:503-532, and vLLM's Neuron plugin the same way,
  vllm-project/vllm-neuron a5ef7c8 worker/neuronx_distributed_model_loader.py:276-303): a deep copy
  of the target's NeuronConfig with `enable_fused_speculation = False` and `is_eagle_draft = True`,
  keeping `speculation_length` and `enable_eagle_speculation` (EAGLE's draft runs one pass more,
  demo 512-514, and returns its hidden states, model_base.py:1460-1464); built with the draft's own
  config.json; wrapped in `FusedSpecNeuronConfig(<model class>._model_cls, draft_config=...,
  draft_model_path=...)` (config.py:1004-1020) set as the target config's `fused_spec_config`. The
  SDK guide's example also turns sequence parallelism off for the draft (aws-neuron/aws-neuron-sdk
  9f6387f libraries/nxd-inference/developer_guides/feature-guide.rst, "Fused Speculation"; "the SDK
  guide" below).
- One decode call (model_base.py `_eagle_token_gen_forward` 2559-2796, `_tkg_postprocessor`
  2841-2897): the draft runs `speculation_length - 1` times (2594), so a row gets k =
  speculation_length - 1 drafted tokens; the target verifies its input token and the k drafts in one
  pass; the row accepts the drafts up to the first the target would not have picked, plus the
  target's own token after them: 1 to k + 1 tokens (n_matches, 2857-2861).
- The outputs (`.fused_outputs`, model_base.py:3872-3874; hf_adapter.py:543-551): [0] the accepted
  tokens (rows, speculation_length) int32, padded with -1 after each row's count (2863-2873); [1]
  each row's last accepted token (2888-2895); [2] the next attention mask; [3] `next_pos_ids`
  (rows, 1) = position + count (2875). NxDI's own generate loop reads the count as `next_pos_ids -
  position_ids` (hf_adapter.py:570-583), as vLLM's plugin does (loader 308-334). A prefill's
  outputs have the same layout, the first token in column 0 (`_cte_postprocessor` 2798-2839,
  hf_adapter.py:535).
- The next call (hf_adapter.py:259-297, 406-436): the row's last accepted token at its position,
  i.e. the position advances by the accepted count. EAGLE keeps each row's hidden state in a
  rolling buffer keyed by that position (modules/eagle/hidden_state.py:83-89: set with the next
  position, read with the current one).
- Buckets: a fused call needs `position + speculation_length` within its bucket
  (model_wrapper.py:826-841, 898-916: "first bucket strictly above, or equal to the largest", else
  "Input len X exceeds largest bucket"), and the traced model clamps positions to `bucket -
  speculation_length` (model_base.py:2959-2962). Its buckets are the token-generation buckets
  (modules/autobucketing.py:282-322).
- Sampling: fused speculation needs on-device sampling (a bare `assert
  self.neuron_config.on_device_sampling_config` in every fused forward, model_base.py:1869, 2081,
  2576); the draft is always greedy (1675-1678); with `do_sample` the target accepts with speculative
  sampling (2685-2766), which keeps the target's distribution; a greedy row (top_k 1) gets exactly
  the target's greedy tokens.
- LoRA: the fused model takes `adapter_ids` (2907) and never passes them on (2940-2942, 2994-3000),
  and a LoRA model's outputs end with its LoRA tensors (1071-1072) where the fused model reads the
  hidden states by position (2086-2087): NxDI has no LoRA with fused speculation.
- The draft checkpoint must hold the target's LM head (`lm_head.weight`): "the draft model must include
  the LM head weights from the target model" (SDK guide, "EAGLE Checkpoint Compatibility"); its
  weights are read from `draft_model_path` under the `draft_model.` prefix (application_base.py:
  658-671), so with `save_sharded_checkpoint` they are baked into the saved shards.
- The same outputs, count and clamp at SDK 2.26 (e07f056 model_base.py:2629-2685, 3798, 2750), 2.27
  (fcb5a86 2844-2900, 4057, 2965) and 2.29 (c63afe0 2791-2847, 3823, 2912).
- Draft-model (non-fused) and Medusa speculation serve batch size 1 only (SDK guide, "Speculative
  Decoding with a Draft model", "Medusa Speculative Decoding"): useless for continuous batching.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from handler.neuron.lora import read_config_json

METHODS = ("eagle", "eagle3")
PADDING_TOKEN = -1  # what fills a row's accepted tokens after its count (model_base.py:1692, 2870)
# The draft's NeuronConfig: the target's, with these attributes set after construction (a keyword would
# not do: NeuronConfig turns fused speculation back on for enable_eagle_speculation, config.py:255-256).
DRAFT_ATTRIBUTES: dict[str, Any] = {
    "enable_fused_speculation": False,
    "is_eagle_draft": True,
    "sequence_parallel_enabled": False,
}
LM_HEAD = "lm_head.weight"
# Config facts an EAGLE draft shares with its target: it reads the target's hidden states and
# predicts over the same vocabulary with the target's LM head.
SHARED_SIZES = ("hidden_size", "vocab_size")


def speculation_length(draft_tokens: int) -> int:
    """NxDI's speculation_length for k drafted tokens a step: k + 1 (the draft runs
    speculation_length - 1 times, model_base.py:2594)."""
    return draft_tokens + 1


def target_keywords(method: str, draft_tokens: int) -> dict[str, Any]:
    """The target NeuronConfig's speculation keywords."""
    if method not in METHODS:
        raise ValueError(f"unknown speculation method {method!r}; one of {METHODS}")
    keywords: dict[str, Any] = {
        "speculation_length": speculation_length(draft_tokens),
        "enable_fused_speculation": True,
        "enable_eagle_speculation": True,
    }
    if method == "eagle3":
        keywords["is_eagle3"] = True
    return keywords


def served_positions(largest_token_bucket: int, draft_tokens: int) -> int:
    """The n_positions a request may use (prompt + max_new_tokens) when every decode needs position
    + k + 1 <= the largest bucket: a row still decoding is at position <= n_positions - 2, so
    n_positions may be the largest bucket less k - 1."""
    return largest_token_bucket - (draft_tokens - 1)


def fits(position: int, draft_tokens: int, largest_token_bucket: int) -> bool:
    """Whether a fused decode at `position` stays within the compiled buckets (no clamping)."""
    return position + speculation_length(draft_tokens) <= largest_token_bucket


def row_tokens(accepted: Sequence[int], position: int, next_position: int) -> list[int]:
    """One row's accepted tokens from a fused call's outputs: the count is `next_pos_ids - position`,
    and the row holds that many tokens followed by padding only. ValueError for outputs that say
    otherwise (a count outside 1..speculation_length, a padding token inside the count, a token after
    it): never served."""
    count = next_position - position
    if not 1 <= count <= len(accepted):
        raise ValueError(
            f"the fused speculation model moved a row from position {position} to {next_position}: "
            f"{count} tokens, not 1 to {len(accepted)}"
        )
    tokens = [int(token) for token in accepted[:count]]
    rest = [int(token) for token in accepted[count:]]
    if any(token < 0 for token in tokens) or any(token != PADDING_TOKEN for token in rest):
        raise ValueError(
            f"the fused speculation model's accepted tokens {list(accepted)} do not match its count {count}"
        )
    return tokens


def _field(config: Any, key: str) -> Any:
    return config.get(key) if isinstance(config, Mapping) else getattr(config, key, None)


def safetensors_keys(path: Path) -> set[str]:
    """The tensor names of a .safetensors file, from its header (8-byte length, then JSON)."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {key for key in header if key != "__metadata__"}


def _weight_names(draft: Path) -> set[str] | None:
    """The draft checkpoint's tensor names, where they can be read without loading it (safetensors,
    or an index); None for a pickle checkpoint."""
    index = draft / "model.safetensors.index.json"
    if index.is_file():
        return set(json.loads(index.read_text()).get("weight_map", {}))
    files = sorted(draft.glob("*.safetensors"))
    if not files:
        return None
    names: set[str] = set()
    for path in files:
        names |= safetensors_keys(path)
    return names


def draft_refusal(draft: Path, target_config: Any) -> str | None:
    """Why this folder cannot be the target's EAGLE draft, or None: it must be a checkpoint folder
    with a config.json whose hidden and vocabulary sizes are the target's, and weights that include
    the target's LM head."""
    if not draft.is_dir():
        return f"{draft} is not a directory; point it at the EAGLE draft's Hugging Face checkpoint folder"
    config = read_config_json(draft)
    if config is None:
        return f"{draft} has no readable config.json"
    for key in SHARED_SIZES:
        mine, theirs = config.get(key), _field(target_config, key)
        if mine != theirs:
            return (
                f"the draft's {key} ({mine}) is not the model's ({theirs}): an EAGLE draft reads the model's hidden "
                "states and predicts with its LM head; use the draft trained for this model"
            )
    try:
        names = _weight_names(draft)
    except (OSError, ValueError, struct.error) as exc:
        return f"cannot read the draft's weights in {draft}: {exc}"
    if names is not None and LM_HEAD not in names:
        return (
            f"the draft in {draft} has no {LM_HEAD}: NxD Inference needs the model's LM head copied into an EAGLE "
            "draft (the published EAGLE drafts lack it; the SDK's guide, 'EAGLE Checkpoint Compatibility', shows "
            "the copy)"
        )
    return None
