"""The host-sampling layer (handler/backends/host_sampling.py): the one place a backend's tokens
are sampled on the host. It must give exactly what driving `BatchSampler` by hand gives, and no
backend may build or drive a sampler of its own."""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends.host_sampling import HostSampling
from handler.request import Constraint, GenerationRequest, SamplingParams, SlotRequest, SlotRequestError, TokenChoice
from handler.sampling.sampler import BatchSampler

BACKENDS = Path(__file__).resolve().parents[2] / "handler" / "backends"
LAYER = BACKENDS / "host_sampling.py"
# The modules that build the layer, once each: the Neuron backends (neuronx, nxdi) get theirs from device_slots.
BUILDERS = {"hf.py", "sim.py", "device_slots.py"}
DRIVES_A_SAMPLER = re.compile(r"sampler\.add|sampler\.sample\(")
EOS = 11


def calls_named(tree: ast.AST, name: str) -> list[ast.Call]:
    """Calls of `name(...)` or `<anything>.name(...)`."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    ]


def names_used(tree: ast.AST) -> set[str]:
    found = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    found |= {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("path", sorted(p for p in BACKENDS.glob("*.py") if p != LAYER), ids=lambda p: p.name)
def test_no_backend_builds_or_drives_a_sampler_of_its_own(path: Path) -> None:
    """Only the layer imports `BatchSampler` and calls its add/sample: a backend goes through
    `HostSampling` (first_tokens, next_tokens, release, refusal, warmup, seconds)."""
    text = path.read_text()
    tree = ast.parse(text)
    used = names_used(tree)
    assert "BatchSampler" not in used and "handler.sampling.sampler" not in used, (
        f"{path.name} reaches BatchSampler itself: build handler.backends.host_sampling.HostSampling instead"
    )
    assert not DRIVES_A_SAMPLER.search(text), f"{path.name} drives a sampler by hand: use its HostSampling"


def test_the_layer_is_built_once_by_each_host_sampling_backend() -> None:
    built = {p.name: len(calls_named(ast.parse(p.read_text()), "HostSampling")) for p in BACKENDS.glob("*.py")}
    assert {name: n for name, n in built.items() if n} == dict.fromkeys(BUILDERS, 1)
    assert len(calls_named(ast.parse(LAYER.read_text()), "BatchSampler")) == 1


class ByHand:
    """What the backends did before the layer: BatchSampler's add, sample, remove, one by one."""

    def __init__(self, *args: Any) -> None:
        self.vocab_size = args[4]
        self.sampler = BatchSampler(*args)

    def first_tokens(self, requests: Sequence[SlotRequest], last_logits: torch.Tensor) -> list[TokenChoice]:
        for request in requests:
            self.sampler.add(request)
        return self.sampler.sample([r.slot for r in requests], last_logits, self.vocab_size)

    def next_tokens(self, slots: Sequence[int], logits: torch.Tensor) -> list[TokenChoice]:
        return self.sampler.sample(slots, logits, self.vocab_size)

    def release(self, slot: int) -> None:
        self.sampler.remove(slot)

    @property
    def seconds(self) -> float:
        return self.sampler.last_s


def scenario(sampling: Any, vocab: int, constraint: Constraint | None = None) -> list[list[TokenChoice]]:
    """Two requests prefilled together, decode steps, one released and a third prefilled into its
    slot, more steps: every call's choices. Logits are `vocab + 4` wide, the padding columns huge
    (a row that read them would pick one)."""
    generator = torch.Generator().manual_seed(0)

    def logits(rows: int) -> torch.Tensor:
        out = torch.randn((rows, vocab + 4), generator=generator) * 3
        out[:, vocab:] = 1e4
        return out

    seeded = SlotRequest(0, (1, 2, 3), SamplingParams(True, 0.9, 6, 0.95, seed=5), logprobs=2)
    greedy = SlotRequest(2, (4, 5), SamplingParams(repetition_penalty=1.4, presence_penalty=0.5), logprobs=1)
    third = SlotRequest(
        0,
        (6, 7, 8, 6),
        SamplingParams(True, 1.2, 0, 0.8, 1.2, seed=9, frequency_penalty=0.3, min_tokens=2, logit_bias=((4, 2.0),)),
        ignore_eos=True,
        logprobs=0,
        constraint=constraint,
    )
    calls = [sampling.first_tokens([seeded, greedy], logits(2))]
    for _ in range(3):
        calls.append(sampling.next_tokens([2, 0], logits(2)))
    sampling.release(0)
    calls.append(sampling.first_tokens([third], logits(1)))
    for _ in range(4):
        calls.append(sampling.next_tokens([0, 2], logits(2)))
        assert sampling.seconds > 0
    sampling.release(0)
    sampling.release(2)
    return calls


def test_the_layer_samples_what_the_sampler_driven_by_hand_samples() -> None:
    vocab = 12
    args = (4, {EOS}, 32, None, vocab)
    layer = scenario(HostSampling(*args), vocab)
    assert layer == scenario(ByHand(*args), vocab)
    assert all(0 <= c.token_id < vocab for call in layer for c in call)  # the padding is never read
    assert all(c.logprob is not None for call in layer for c in call)


def test_a_constrained_row_gets_the_same_tokens_and_masks_through_the_layer(tiny_tokenizer) -> None:
    vocab = len(tiny_tokenizer)
    eos = tiny_tokenizer.eos_token_id
    args = (4, {eos}, 64, tiny_tokenizer, vocab)
    constraint = Constraint("regex", "[0-9]{2}x")
    layer = HostSampling(*args)
    layer.warmup()
    calls = scenario(layer, vocab, constraint)
    assert calls == scenario(ByHand(*args), vocab, constraint)
    third = [call[0].token_id for call in calls[4:]]  # the constrained row (slot 0), to its EOS
    assert eos in third and re.fullmatch(r"[0-9]{2}x", tiny_tokenizer.decode(third[: third.index(eos)]))


def test_seconds_is_the_last_calls_host_time_and_release_forgets_the_slot() -> None:
    layer = HostSampling(2, {EOS}, 16, None, 12)
    assert layer.seconds == 0.0
    request = SlotRequest(1, (1, 2), SamplingParams(True, seed=3))
    first = layer.first_tokens([request], torch.zeros((1, 12)))
    assert layer.seconds == layer.sampler.last_s > 0
    layer.release(1)
    layer.release(1)  # a free slot: a no-op
    with pytest.raises(KeyError):
        layer.next_tokens([1], torch.zeros((1, 12)))
    assert layer.first_tokens([request], torch.zeros((1, 12))) == first  # the same seed, the same draw


def test_without_a_tokenizer_a_constraint_is_refused_and_never_registered() -> None:
    layer = HostSampling(2, {EOS}, 16)
    layer.warmup()  # nothing to build
    constrained = Constraint("regex", "[0-9]")
    refusal = layer.refusal(GenerationRequest("hi", 4, constraint=constrained))
    assert refusal is not None and refusal[0] == "constraint"
    assert layer.refusal(GenerationRequest("hi", 4)) is None
    with pytest.raises(SlotRequestError):
        layer.first_tokens([SlotRequest(0, (1,), constraint=constrained)], torch.zeros((1, 12)))
    with pytest.raises(KeyError):
        layer.next_tokens([0], torch.zeros((1, 12)))
