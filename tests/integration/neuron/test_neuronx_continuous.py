"""The neuronx backend's step contract on the fake transformers-neuronx: prefill one request at a
time into its slot, decode every live slot together, release. The fake keeps one KV line per
slot and reproduces the SDK's decode trap (a line left out of a decode call gets token 0 at
cache id 0), so these tests fail if the backend ever sends what would corrupt a sequence on a
device: a request's greedy tokens must not depend on who else is in the batch, or when it came.
What nxdi must do too (greedy tokens, joins, decode refusals, buckets) is in test_device_backends.py,
run over both fakes; here, what only transformers-neuronx does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from handler.request import SamplingParams
from tests.support.neuron import Driver, calls, greedy, hf_greedy, neuronx_yaml, run_alone

pytestmark = pytest.mark.usefixtures("fake_neuronx")

PROMPTS = ["Today the weather is", "Once upon a time there was", "The capital of France"]


@pytest.fixture
def backend(checkpoint, start_backend):
    """Three slots, prompt buckets 16 and 256."""
    return start_backend(neuronx_yaml(checkpoint, n_slots=3, neuronx={"context_length_estimate": [16, 256]}))


def forwards(call_log: Path, kind: str) -> list[dict[str, Any]]:
    return [call for call in calls(call_log, "forward") if call["kind"] == kind]


def test_a_one_token_prompt_joining_mid_decode_leaves_the_others_unchanged(backend, fake_neuronx, checkpoint):
    """(d) A 1-token prompt is prefilled as the context encoding of [token, 0] at cache ids [0, 0]:
    it never reaches the decode kernel, so the other lines keep their position 0."""
    a, b = backend.encode(PROMPTS[0]), backend.encode(PROMPTS[1])
    one = backend.encode("Today")[:1]
    alone = {"a": run_alone(backend, a, 10), "b": run_alone(backend, b, 10), "one": run_alone(backend, one, 6)}
    assert alone["one"] == hf_greedy(checkpoint, one, 6)

    driver = Driver(backend)
    driver.join(greedy(0, a), greedy(1, b))
    for _ in range(3):
        driver.step()
    before = len(calls(fake_neuronx, "forward"))
    driver.join(greedy(2, one))
    [prefill] = calls(fake_neuronx, "forward")[before:]
    assert prefill["kind"] == "context" and prefill["length"] == 2 and prefill["start_ids"] == [2]
    assert prefill["last_token_ids"] == [0]  # logits of position 0: the prompt's only token
    for _ in range(6):
        driver.step()
    assert driver.leave(2)[:6] == alone["one"]
    assert driver.leave(0)[:10] == alone["a"]
    assert driver.leave(1)[:10] == alone["b"]


def test_sampling_is_per_slot_whoever_the_batch_mates(backend):
    """A seeded sampled request draws from its own generator: same tokens alone or mid-batch, and
    logprobs come with them when asked."""
    sampling = SamplingParams(do_sample=True, temperature=0.8, top_k=20, seed=7)
    prompt = backend.encode(PROMPTS[2])
    driver = Driver(backend)
    driver.join(greedy(0, prompt, sampling=sampling, logprobs=2))
    for _ in range(7):
        driver.step()
    alone = driver.leave(0)

    driver.join(greedy(1, backend.encode(PROMPTS[0]), sampling=SamplingParams(do_sample=True, seed=1)))
    driver.step()
    [choice] = backend.prefill([greedy(2, prompt, sampling=sampling, logprobs=2)])
    assert choice.logprob is not None and len(choice.top_logprobs) == 2
    driver.tokens[2] = [choice.token_id]
    for _ in range(7):
        driver.step()
    assert driver.leave(2) == alone


def test_the_hold_waits_at_a_slots_decode_step(backend, fake_neuronx, monkeypatch, tmp_path):
    """The fake's test hook still works per slot: a decode call waits while the hold file exists
    when one of its slots reaches FAKE_NEURONX_HOLD_AT_STEP (here it times out at once)."""
    hold = tmp_path / "hold"
    hold.touch()
    monkeypatch.setenv("FAKE_NEURONX_HOLD_FILE", str(hold))
    monkeypatch.setenv("FAKE_NEURONX_HOLD_AT_STEP", "3")
    monkeypatch.setenv("FAKE_NEURONX_HOLD_MAX_S", "0.05")
    driver = Driver(backend)
    driver.join(greedy(0, backend.encode(PROMPTS[0])))
    driver.step()
    driver.join(greedy(1, backend.encode(PROMPTS[1])))
    for _ in range(3):
        driver.step()
    assert [c["step"] for c in calls(fake_neuronx, "hold")] == [3, 3]  # slot 0 at its 3rd step, then slot 1
    assert all(c["timed_out"] for c in calls(fake_neuronx, "release"))


# -- the fake itself: it must reproduce the SDK's trap, or the tests above prove nothing ------------------


def fake_model(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n_slots: int = 3, buckets: tuple = (16, 256)
) -> Any:
    from transformers_neuronx import ContinuousBatchingConfig, LlamaForSampling, NeuronConfig

    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "compile-cache"))
    model = LlamaForSampling.from_pretrained(
        str(checkpoint),
        batch_size=n_slots,
        tp_degree=1,
        n_positions=256,
        context_length_estimate=list(buckets),
        neuron_config=NeuronConfig(continuous_batching=ContinuousBatchingConfig(max_num_seqs=n_slots)),
    )
    model.to_neuron()
    return model


def encode(model: Any, slot: int, prompt: list[int]) -> int:
    length = len(prompt)
    logits = model.forward(torch.tensor([prompt]), cache_ids=torch.arange(length)[None], start_ids=torch.tensor([slot]))
    return int(logits[0].argmax())


def step(model: Any, rows: dict[int, list[int]], prompt_lengths: dict[int, int]) -> None:
    """One decode call over the slots in `rows` (slot -> its tokens so far); appends each one's next token."""
    slots = list(rows)
    logits = model.forward(
        torch.tensor([[rows[s][-1]] for s in slots]),
        cache_ids=torch.tensor([[prompt_lengths[s] + len(rows[s]) - 1] for s in slots]),
        start_ids=torch.tensor(slots),
    )
    for slot, row in zip(slots, logits, strict=True):
        rows[slot].append(int(row.argmax()))


def test_the_fake_overwrites_position_0_of_a_line_left_out_of_a_decode(
    checkpoint, fake_neuronx, monkeypatch, tmp_path, tiny_tokenizer
):
    """(b) Driving the fake model directly: a live line left out of one decode call (it only pauses)
    continues with other tokens than it does when every call names it; the line that was named
    is unaffected."""
    model = fake_model(checkpoint, monkeypatch, tmp_path)
    prompts = {0: tiny_tokenizer(PROMPTS[0])["input_ids"], 1: tiny_tokenizer(PROMPTS[1])["input_ids"]}
    lengths = {slot: len(prompt) for slot, prompt in prompts.items()}

    reference = {slot: [encode(model, slot, prompt)] for slot, prompt in prompts.items()}
    for _ in range(9):
        step(model, reference, lengths)

    rows = {slot: [encode(model, slot, prompt)] for slot, prompt in prompts.items()}
    step(model, rows, lengths)
    paused = {0: rows[0]}
    step(model, paused, lengths)  # line 1 left out: the kernel writes token 0 at its cache id 0
    assert forwards(fake_neuronx, "decode")[-1]["padded_lines"] == [1, 2]
    for _ in range(7):
        step(model, rows, lengths)
    assert rows[0] == reference[0]
    assert rows[1][:2] == reference[1][:2]  # up to the omission, the same
    assert rows[1] != reference[1][: len(rows[1])]  # after it, line 1 reads a wrong position 0


def test_the_fake_runs_a_plain_one_token_prompt_through_the_decode_kernel(
    checkpoint, fake_neuronx, monkeypatch, tmp_path, tiny_tokenizer
):
    """Why the backend pads a 1-token prompt: `forward([[t]], cache_ids [[0]], start_ids [2])` is token
    generation, which overwrites position 0 of the live lines 0 and 1; [[t, 0]] at cache ids [[0, 0]]
    is a context encoding of line 2 alone and gives the same first token."""
    model = fake_model(checkpoint, monkeypatch, tmp_path)
    prompts = {0: tiny_tokenizer(PROMPTS[0])["input_ids"], 1: tiny_tokenizer(PROMPTS[1])["input_ids"]}
    lengths = {slot: len(prompt) for slot, prompt in prompts.items()}
    token = tiny_tokenizer("Today")["input_ids"][0]

    def run(input_ids: list[int], cache_ids: list[int]) -> tuple[int, dict[int, list[int]]]:
        """Lines 0 and 1 live; slot 2's 1-token prompt sent as given; then 6 decode steps of lines 0 and 1."""
        rows = {slot: [encode(model, slot, prompt)] for slot, prompt in prompts.items()}
        step(model, rows, lengths)
        logits = model.forward(torch.tensor([input_ids]), torch.tensor([cache_ids]), torch.tensor([2]))
        for _ in range(6):
            step(model, rows, lengths)
        return int(logits[0].argmax()), rows

    padded_first, padded_rows = run([token, 0], [0, 0])
    assert forwards(fake_neuronx, "context")[-1]["start_ids"] == [2]
    plain_first, plain_rows = run([token], [0])
    trap = forwards(fake_neuronx, "decode")[-7]
    assert trap["start_ids"] == [2] and trap["padded_lines"] == [0, 1]
    assert plain_first == padded_first  # the new sequence's first token is the same either way
    for line in (0, 1):  # but lines 0 and 1 lost their position 0
        assert plain_rows[line][:2] == padded_rows[line][:2] and plain_rows[line] != padded_rows[line]


def test_the_fake_decode_needs_cache_ids_of_the_input_ids_dtype(checkpoint, monkeypatch, tmp_path):
    """The real token-generation padding scatters cache_ids into a tensor of input_ids' dtype."""
    model = fake_model(checkpoint, monkeypatch, tmp_path)
    encode(model, 0, [5, 6, 7])
    with pytest.raises(RuntimeError, match="dtype"):
        model.forward(torch.tensor([[8]]), torch.tensor([[3]], dtype=torch.int32), torch.tensor([0]))


def test_a_one_token_row_that_fills_its_bucket_would_keep_its_cache_ids(checkpoint, monkeypatch, tmp_path):
    """Why every bucket is at least 3 tokens (handler.neuronx.context_length_estimate): in a bucket of
    exactly 2 the row [t, 0] keeps its cache ids [0, 0], so the pad lands on position 0."""
    from handler.config import ServingConfig
    from handler.errors import ConfigError

    token = 5
    runs = []
    for buckets in ((16, 256), (2, 256)):
        model = fake_model(checkpoint, monkeypatch, tmp_path, buckets=buckets)
        first = model.forward(torch.tensor([[token, 0]]), torch.zeros((1, 2), dtype=torch.long), torch.tensor([0]))
        rows = {0: [int(first[0].argmax())]}
        for _ in range(4):
            step(model, rows, {0: 1})
        runs.append(rows[0])
    assert runs[0][0] == runs[1][0] and runs[0] != runs[1]
    raw = neuronx_yaml(checkpoint, neuronx={"context_length_estimate": [2, 256]})
    with pytest.raises(ConfigError, match=r"context_length_estimate: .*must be .* at least 3"):
        ServingConfig.from_model_yaml(raw)
