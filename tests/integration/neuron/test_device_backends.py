"""What the two Neuron backends (neuronx on the fake transformers-neuronx, nxdi on the fake NxD
Inference) must both do, proved once over both fakes: a greedy request's tokens are the model's own
whoever its batch-mates are and whenever it came, a decode names every live slot, prompts stay
within the compiled buckets, compiling off refuses, replicas compile once. Both fakes reproduce
their SDK's decode trap (a slot left out of a decode gets its KV overwritten), so these tests fail
if a backend ever sends what would corrupt a sequence on a device. What only one SDK does is
tested in its own files (test_neuronx_*.py, test_nxdi.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.config import ServingConfig
from handler.engine.sequence import Sequence
from handler.errors import ConfigError
from handler.replicas.model import ReplicatedModel, start_replicas
from handler.request import GenerationRequest
from tests.support.neuron import Driver, calls, greedy, hf_greedy, neuronx_yaml, nxdi_yaml, run_alone

pytestmark = pytest.mark.usefixtures("fake_neuronx", "one_torch_thread")

PROMPTS = ["Today the weather is", "Once upon a time there was", "The capital of France"]


def neuronx_decodes_name_every_live_slot(call_log: Path, n_slots: int) -> None:
    """Every decode named every live slot: a padded line was always a free one."""
    for call in calls(call_log, "forward"):
        if call["kind"] == "decode":
            assert call["rows"] + len(call["padded_lines"]) == call["batch_size"] == n_slots


def nxdi_decodes_go_in_slot_order(call_log: Path, n_slots: int) -> None:
    """A full batch ignores seq_ids (row i is KV row i), so every decode's rows are in slot order."""
    decodes = [f for f in calls(call_log, "forward") if f["kind"] != "context"]
    assert decodes and all(f["seq_ids"] == sorted(f["seq_ids"]) for f in decodes)


def neuronx_last_context_bucket(call_log: Path) -> int:
    return [f for f in calls(call_log, "forward") if f["kind"] == "context"][-1]["bucket"]


def nxdi_last_context_bucket(call_log: Path) -> int:
    return [f for f in calls(call_log, "forward") if f["kind"] == "context"][-1]["programs"][0]["bucket"]


def neuronx_run_past_the_largest_bucket(backend: Any, length: int) -> None:
    backend.model.forward(
        torch.tensor([[5] * length]), cache_ids=torch.arange(length)[None], start_ids=torch.tensor([0])
    )


def nxdi_run_past_the_largest_bucket(backend: Any, length: int) -> None:
    backend._forward(torch.tensor([[5] * length]), torch.arange(length)[None], [0], [(1.0, 1.0, 1.0)])


def neuronx_placements(call_log: Path) -> list[tuple[str, str, int]]:
    """(compile | load, the cores, the process) of each model put on the cores, in order."""
    return [(c["mode"], c["visible_cores"], c["pid"]) for c in calls(call_log, "to_neuron")]


def nxdi_placements(call_log: Path) -> list[tuple[str, str, int]]:
    """As for neuronx; NxDI loads what it compiled (in a child process), so a compile's load is its place."""
    compiled = len(calls(call_log, "compile"))
    loads = calls(call_log, "load")
    return [("compile" if i < compiled else "load", c["visible_cores"], c["pid"]) for i, c in enumerate(loads)]


@dataclass(frozen=True)
class Sdk:
    """One backend on its fake SDK, and how to read that fake's call log."""

    name: str
    section: str  # handler.<name>'s key for the context buckets
    trap: str  # what the refusal of a decode that leaves a live slot out says the SDK would do
    yaml: Callable[..., dict[str, Any]]
    check_decodes: Callable[[Path, int], None]
    last_context_bucket: Callable[[Path], int]
    run_past_the_largest_bucket: Callable[[Any, int], None]
    sdk_refusal: str  # what the SDK itself raises for a prompt above its largest context bucket
    placements: Callable[[Path], list[tuple[str, str, int]]]
    save_call: str  # the fake's call that writes the compiled artifacts

    def model_yaml(self, checkpoint: Path, buckets: list[int], n_slots: int = 3, **handler: Any) -> dict[str, Any]:
        section = {self.section: buckets, **handler.pop(self.name, {})}
        return self.yaml(checkpoint, n_slots=n_slots, **{self.name: section}, **handler)


SDKS = {
    "neuronx": Sdk(
        "neuronx",
        "context_length_estimate",
        "overwrites position 0",
        neuronx_yaml,
        neuronx_decodes_name_every_live_slot,
        neuronx_last_context_bucket,
        neuronx_run_past_the_largest_bucket,
        r"invalid input prompt length \(65 <= 64\)",
        neuronx_placements,
        "save",
    ),
    "nxdi": Sdk(
        "nxdi",
        "context_buckets",
        "copy of the first row, overwriting its KV",
        nxdi_yaml,
        nxdi_decodes_go_in_slot_order,
        nxdi_last_context_bucket,
        nxdi_run_past_the_largest_bucket,
        r"Input len 65 exceeds largest bucket \(64\) for context_encoding_model",
        nxdi_placements,
        "compile",
    ),
}


@pytest.fixture(params=sorted(SDKS))
def sdk(request) -> Sdk:
    return SDKS[request.param]


@pytest.fixture
def backend(sdk, checkpoint, start_backend):
    """Three slots, prompt buckets 16 and 256, on either SDK's fake."""
    return start_backend(sdk.model_yaml(checkpoint, [16, 256]))


def test_greedy_tokens_are_the_models_own(backend, checkpoint):
    """Each prompt alone gives exactly the Hugging Face model's greedy tokens (a 1-token prompt too)."""
    for text in [*PROMPTS, "Hi"]:
        prompt = backend.encode(text)
        assert run_alone(backend, prompt, 8) == hf_greedy(checkpoint, prompt, 8)
    one = backend.encode("Today")[:1]
    assert run_alone(backend, one, 8) == hf_greedy(checkpoint, one, 8)


def test_a_request_that_joins_mid_decode_yields_its_tokens_alone(sdk, backend, fake_neuronx):
    """The invariant: a greedy request that joins while others are mid-decode yields exactly the
    tokens it yields alone, and the others' tokens do not change either."""
    a, b, c = (backend.encode(text) for text in PROMPTS)
    alone = {name: run_alone(backend, prompt, 12) for name, prompt in {"a": a, "b": b, "c": c}.items()}
    driver = Driver(backend)
    driver.join(greedy(2, a))  # slot 2 first: a partial batch whose rows are not slots 0..n-1
    for _ in range(3):
        driver.step()
    driver.join(greedy(0, b))  # slot 0 while slot 1 stays free
    for _ in range(2):
        driver.step()
    driver.join(greedy(1, c))  # now a full batch
    for _ in range(11):
        driver.step()
    assert driver.leave(2)[:12] == alone["a"]
    assert driver.leave(0)[:12] == alone["b"]
    assert driver.leave(1)[:12] == alone["c"]
    sdk.check_decodes(fake_neuronx, 3)


def test_a_slot_reused_after_release_starts_clean(backend):
    prompt = backend.encode(PROMPTS[0])
    expected = run_alone(backend, prompt, 6, slot=1)
    driver = Driver(backend)
    driver.join(greedy(1, backend.encode("Hi")), greedy(0, backend.encode(PROMPTS[1])))
    for _ in range(20):
        driver.step()
    driver.leave(1)  # a longer sequence leaves its KV behind in line 1
    driver.join(greedy(1, prompt))
    for _ in range(5):
        driver.step()
    assert driver.leave(1) == expected


def test_decode_refuses_a_call_that_is_not_every_live_slot(sdk, backend, fake_neuronx):
    """Leaving a live slot out would overwrite its KV on a device: refused before the model runs."""
    driver = Driver(backend)
    driver.join(greedy(0, backend.encode(PROMPTS[0])), greedy(2, backend.encode(PROMPTS[1])))
    before = len(calls(fake_neuronx, "forward"))
    for wrong in ([0], [2], [0, 1, 2], [0, 2, 2], []):
        with pytest.raises(ValueError, match=rf"every live slot exactly once.*{sdk.trap}"):
            backend.decode(wrong)
    assert len(calls(fake_neuronx, "forward")) == before
    assert len(backend.decode([2, 0])) == 2  # any order of exactly the live slots is fine
    backend.release(0)
    backend.release(2)
    assert backend.decode([]) == []  # nothing live: nothing to run


def test_decode_returns_tokens_in_the_order_asked(backend):
    """Whatever order the SDK needs the rows in, the answers come back in the caller's."""
    prompts = {0: backend.encode(PROMPTS[0]), 2: backend.encode(PROMPTS[1])}
    alone = {slot: run_alone(backend, prompt, 2) for slot, prompt in prompts.items()}

    def one_step(order: list[int]) -> list[int]:
        Driver(backend).join(*(greedy(slot, prompt) for slot, prompt in prompts.items()))
        tokens = [choice.token_id for choice in backend.decode(order)]
        for slot in prompts:
            backend.release(slot)
        return tokens

    forward, backward = one_step([0, 2]), one_step([2, 0])
    assert forward == [alone[0][1], alone[2][1]] and backward == forward[::-1] and forward[0] != forward[1]


def test_prefill_refusals(backend):
    prompt = backend.encode(PROMPTS[0])
    backend.prefill([greedy(0, prompt)])
    cases = [
        ([greedy(0, prompt)], "slot 0 is live"),
        ([greedy(1, prompt), greedy(1, prompt)], "appears twice"),
        ([greedy(3, prompt)], "slot 3 is not one of the 3 slots"),
        ([greedy(1, ())], "a prompt of 0 tokens"),
        ([greedy(1, [5] * 257)], r"a prompt of 257 tokens; the compiled context buckets \[16, 256\] take 1 to 256"),
    ]
    for requests, message in cases:
        with pytest.raises(ValueError, match=message):
            backend.prefill(requests)
    backend.release(0)
    backend.release(0)  # releasing a free slot is harmless
    backend.prefill([greedy(0, prompt)])


def test_the_longest_prompt_is_the_largest_context_bucket(sdk, checkpoint, start_backend, fake_neuronx):
    """The SDK fails a prompt above its largest context bucket (there is no token-by-token fallback
    under continuous batching): max_prompt_tokens tells the service to answer 400 first, and prefill
    refuses it before the SDK sees it."""
    backend = start_backend(sdk.model_yaml(checkpoint, [16, 64], n_slots=2), warmup=False)
    assert backend.max_prompt_tokens == 64 and backend.n_positions == 256
    with pytest.raises((AssertionError, ValueError), match=sdk.sdk_refusal):
        sdk.run_past_the_largest_bucket(backend, 65)
    with pytest.raises(
        ValueError, match=r"a prompt of 65 tokens; the compiled context buckets \[16, 64\] take 1 to 64"
    ):
        backend.prefill([greedy(0, [5] * 65)])
    [choice] = backend.prefill([greedy(0, [5] * 64)])
    assert sdk.last_context_bucket(fake_neuronx) == 64 and isinstance(choice.token_id, int)
    backend.release(0)
    assert len(run_alone(backend, [5] * 64, 3)) == 3  # and decodes after it


def test_positions_stay_below_n_positions(sdk, checkpoint, start_backend):
    backend = start_backend(sdk.model_yaml(checkpoint, [16, 256], n_slots=2), warmup=False)
    backend.prefill([greedy(0, [5] * 255)])
    backend.decode([0])  # its first generated token goes to position 255, the last one
    with pytest.raises(ValueError, match=r"slot 0: its next token would go to position 256, beyond the 256"):
        backend.decode([0])


def test_compile_on_start_false_refuses_without_artifacts(sdk, fake_neuronx, checkpoint, start_backend):
    refused = rf"backend {sdk.name}: cannot use the compiled artifacts .*handler\.{sdk.name}\.compile_on_start is false"
    with pytest.raises(ConfigError, match=rf"{refused}.*make compile"):
        start_backend(sdk.model_yaml(checkpoint, [16, 256], **{sdk.name: {"compile_on_start": False}}))
    assert not sdk.placements(fake_neuronx) and not calls(fake_neuronx, "compile")


# -- replicas ----------------------------------------------------------------------------------------
def generate(model: ReplicatedModel, prompts: list[str]) -> dict[str, tuple[int | None, str]]:
    """Each prompt through the replica set: the replica that served it and its finish reason."""
    replicas = model.replicas
    replicas.start()
    sequences = {}
    for i, prompt in enumerate(prompts):
        request = GenerationRequest(prompt, 6, ignore_eos=True)
        sequence = Sequence(request, model.encode(prompt), model.tokenizer, model.eos_token_ids, f"r{i}")
        replicas.submit(sequence)
        sequences[sequence.request_id] = (replicas.replica_of(sequence.request_id), sequence)
    deadline = time.monotonic() + 60
    ended: set[str] = set()
    while len(ended) < len(sequences) and time.monotonic() < deadline:
        replicas.wait(sequences, replicas.steps, 1.0)
        ended |= {rid for rid, update in replicas.take(sequences).items() if update.ended}
    return {rid: (replica, str(s.finish_reason)) for rid, (replica, s) in sequences.items()}


@pytest.mark.timeout(240)
def test_two_replicas_on_disjoint_cores_compile_once(sdk, fake_neuronx, checkpoint):
    """Each replica is a process of its own on its own tp_degree cores; the first compiles, the
    other loads what it saved, a restart loads both."""
    yaml = sdk.model_yaml(checkpoint, [16, 256], n_slots=2, tp_degree=2, **{sdk.name: {"num_cores": 4}})
    yaml["scheduler"]["replicas"] = 2
    yaml["batchSize"] = 8
    model = start_replicas(ServingConfig.from_model_yaml(yaml), str(checkpoint))
    try:
        served = generate(model, ["Hello there", "Another prompt"])
    finally:
        model.close()
    assert sorted(served.values()) == [(0, "length"), (1, "length")]
    first = sdk.placements(fake_neuronx)
    assert sorted((mode, cores) for mode, cores, _ in first) == [("compile", "0-1"), ("load", "2-3")]
    assert len({pid for *_, pid in first}) == 2 and os.getpid() not in {pid for *_, pid in first}
    assert len(calls(fake_neuronx, sdk.save_call)) == 1

    again = start_replicas(ServingConfig.from_model_yaml(yaml), str(checkpoint))  # the artifacts are there
    again.close()
    second = sdk.placements(fake_neuronx)[len(first) :]
    assert sorted((mode, cores) for mode, cores, _ in second) == [("load", "0-1"), ("load", "2-3")]
