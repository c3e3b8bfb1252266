"""The hf backend on the step-level contract, with the real tiny model: slots join and
leave between decode steps and no request's tokens depend on its batch-mates.

handler.cpu_threads sets torch's intra-op threads (process-wide; tests/conftest.py restores
the count after every test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handler.backends.hf import HFBackend
from handler.backends.kv_cache import cache_of, layers_of, stack, truncate, unpad_row
from handler.config import HandlerConfig
from handler.request import SamplingParams, SlotRequest, TokenChoice

REPO = Path(__file__).resolve().parents[2]
N_SLOTS = 4
SAMPLED = SamplingParams(do_sample=True, temperature=0.9, top_k=40, top_p=0.95, seed=1234)


@pytest.fixture
def backend(tiny_model_dir: Path) -> HFBackend:
    # One intra-op thread: a tiny model's steps are overhead-bound, and spinning threads slow a shared host.
    config = HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1)
    return HFBackend(config, tiny_model_dir, N_SLOTS)


def prompt(backend: HFBackend, text: str) -> tuple[int, ...]:
    return tuple(backend.encode(text))


def long_prompt(backend: HFBackend, n: int) -> tuple[int, ...]:
    ids = backend.encode((REPO / "scripts" / "model" / "corpus.txt").read_text())
    return tuple(ids[i % len(ids)] for i in range(n))


def alone(backend: HFBackend, request: SlotRequest, n: int) -> list[TokenChoice]:
    """The request's first n tokens with the backend to itself."""
    choices = backend.prefill([request])
    while len(choices) < n:
        choices += backend.decode([request.slot])
    backend.release(request.slot)
    return choices


def ids(choices: list[TokenChoice]) -> list[int]:
    return [choice.token_id for choice in choices]


class Run:
    """Drives several slots by hand: `join` prefills, `step` decodes every live slot."""

    def __init__(self, backend: HFBackend) -> None:
        self.backend = backend
        self.out: dict[int, list[TokenChoice]] = {}
        self.live: list[int] = []

    def join(self, *requests: SlotRequest) -> None:
        for request, choice in zip(requests, self.backend.prefill(requests), strict=True):
            self.out[request.slot] = [choice]
            self.live.append(request.slot)

    def step(self, times: int = 1) -> None:
        for _ in range(times):
            for slot, choice in zip(self.live, self.backend.decode(self.live), strict=True):
                self.out[slot].append(choice)

    def leave(self, slot: int) -> None:
        self.backend.release(slot)
        self.live.remove(slot)


# -- construction --------------------------------------------------------------------------


def test_cpu_threads_sets_torch_intra_op_threads(tiny_model_dir):
    torch.set_num_threads(2)  # start from another count, so that "1" must come from the setting
    assert torch.get_num_threads() == 2
    HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1), tiny_model_dir, 2)
    assert torch.get_num_threads() == 1


def test_without_cpu_threads_torch_threads_are_left_alone(tiny_model_dir):
    torch.set_num_threads(3)  # a count nothing in the handler would pick
    HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir)), tiny_model_dir, 2)
    assert torch.get_num_threads() == 3


def test_contract_attributes_and_warmup(backend):
    assert backend.n_slots == N_SLOTS
    assert backend.max_prompt_tokens is None
    assert backend.n_positions == 1024
    assert backend.eos_token_ids == {backend.tokenizer.eos_token_id}
    backend.warmup()
    assert backend.prefill([SlotRequest(0, prompt(backend, "hi"))])  # warmup left slot 0 free


# -- (a) joining and leaving never changes anyone's tokens ---------------------------------


def test_a_join_mid_decode_and_release_leave_every_request_unchanged(backend):
    a = SlotRequest(0, prompt(backend, "Today the weather is"))
    b = SlotRequest(1, prompt(backend, "Once upon a time there was a small model that"))
    c = SlotRequest(2, prompt(backend, "The"))
    want = {r.slot: ids(alone(backend, r, 24)) for r in (a, b, c)}

    run = Run(backend)
    run.join(a, b)
    run.step(5)  # a and b mid-decode
    run.join(c)  # c joins between steps
    run.step(6)
    run.leave(0)  # a leaves; b and c go on
    run.step(12)
    assert ids(run.out[0]) == want[0][:12]
    assert ids(run.out[1]) == want[1][: len(run.out[1])] and len(run.out[1]) == 24
    assert ids(run.out[2]) == want[2][: len(run.out[2])] and len(run.out[2]) == 19


def test_a_slot_released_and_prefilled_again_before_the_next_step(backend):
    """The stacked batch still has the old sequence's row for that slot; it must not be reused."""
    a = SlotRequest(0, prompt(backend, "Today the weather is"))
    b = SlotRequest(1, prompt(backend, "A long time ago"))
    b2 = SlotRequest(1, prompt(backend, "Something else entirely, and longer than before"))
    want_a, want_b2 = ids(alone(backend, a, 16)), ids(alone(backend, b2, 8))
    run = Run(backend)
    run.join(a, b)
    run.step(4)
    run.leave(1)
    run.join(b2)  # same slot, same set of slot ids as the last step
    run.step(7)
    assert ids(run.out[0]) == want_a[:12]
    assert ids(run.out[1]) == want_b2


def test_steady_decode_reuses_the_stacked_cache(backend, monkeypatch):
    restacks: list[tuple[int, ...]] = []
    real = backend._restack
    monkeypatch.setattr(backend, "_restack", lambda slots: restacks.append(slots) or real(slots))
    run = Run(backend)
    run.join(SlotRequest(0, prompt(backend, "one")), SlotRequest(1, prompt(backend, "two two")))
    run.step(5)
    assert restacks == [(0, 1)]
    run.join(SlotRequest(3, prompt(backend, "three")))
    run.step(3)
    run.leave(1)
    run.step(3)
    assert restacks == [(0, 1), (0, 1, 3), (0, 3)]


def test_slot_order_of_a_decode_call_is_the_order_of_its_answer(backend):
    a, b = SlotRequest(0, prompt(backend, "alpha")), SlotRequest(2, prompt(backend, "beta gamma delta"))
    want_a, want_b = ids(alone(backend, a, 6)), ids(alone(backend, b, 6))
    first = backend.prefill([a, b])
    got = {0: [first[0].token_id], 2: [first[1].token_id]}
    for order in ([0, 2], [2, 0], [0, 2], [2, 0], [2, 0]):
        for slot, choice in zip(order, backend.decode(order), strict=True):
            got[slot].append(choice.token_id)
    assert got == {0: want_a, 2: want_b}


def test_a_forward_that_fails_part_way_leaves_the_cache_usable(backend):
    a, b = SlotRequest(0, prompt(backend, "Today the weather is")), SlotRequest(1, prompt(backend, "and then"))
    want_a, want_b = ids(alone(backend, a, 10)), ids(alone(backend, b, 10))
    run = Run(backend)
    run.join(a, b)
    run.step(3)

    def fail(*_args):
        raise RuntimeError("injected")

    handle = backend.model.model.layers[-1].register_forward_pre_hook(fail)  # after the first layers appended
    with pytest.raises(RuntimeError, match="injected"):
        backend.decode([0, 1])
    handle.remove()
    run.step(6)
    assert ids(run.out[0]) == want_a and ids(run.out[1]) == want_b


def test_a_prefill_that_fails_part_way_leaves_none_of_its_slots_occupied(backend):
    calls = []

    def fail_second(*_args):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("injected")

    handle = backend.model.model.layers[0].register_forward_pre_hook(fail_second)
    with pytest.raises(RuntimeError, match="injected"):
        backend.prefill([SlotRequest(0, prompt(backend, "first")), SlotRequest(1, prompt(backend, "second"))])
    handle.remove()
    with pytest.raises(ValueError, match="never prefilled"):
        backend.decode([0])
    assert len(backend.prefill([SlotRequest(0, (5,)), SlotRequest(1, (6,))])) == 2


# -- (b) a seeded sampled request does not depend on its batch-mates -----------------------


def test_b_seeded_sampling_is_the_same_alone_and_with_batch_mates(backend):
    seeded = SlotRequest(1, prompt(backend, "Today the weather is"), SAMPLED)
    want = ids(alone(backend, seeded, 20))
    assert ids(alone(backend, seeded, 20)) == want  # reproducible
    assert want != ids(alone(backend, SlotRequest(1, seeded.prompt_ids), 20))  # it does sample
    greedy = ids(alone(backend, SlotRequest(0, prompt(backend, "Once upon")), 23))

    run = Run(backend)
    run.join(
        SlotRequest(0, prompt(backend, "Once upon")),
        SlotRequest(3, prompt(backend, "An unseeded mate"), SamplingParams(do_sample=True)),
    )
    run.step(3)
    run.join(seeded)
    run.step(10)
    run.leave(3)
    run.step(9)
    assert ids(run.out[1]) == want
    assert ids(run.out[0]) == greedy


# -- (c) slots: reuse and errors -----------------------------------------------------------


def test_c_released_slots_are_reused(backend):
    a = SlotRequest(2, prompt(backend, "Today the weather is"))
    first = ids(alone(backend, a, 8))
    assert ids(alone(backend, a, 8)) == first  # the same slot again, fresh
    for slot in range(N_SLOTS):  # every slot, several times over
        for _ in range(2):
            assert ids(alone(backend, SlotRequest(slot, a.prompt_ids), 8)) == first


def test_c_decode_of_an_unknown_or_released_slot_raises(backend):
    with pytest.raises(ValueError, match="never prefilled"):
        backend.decode([0])
    backend.prefill([SlotRequest(0, prompt(backend, "x"))])
    with pytest.raises(ValueError, match="never prefilled"):
        backend.decode([0, 1])
    backend.decode([0])
    backend.release(0)
    with pytest.raises(ValueError, match="released"):
        backend.decode([0])
    with pytest.raises(ValueError, match="out of range"):
        backend.decode([N_SLOTS])
    backend.release(0)  # releasing a free slot again is harmless


def test_c_prefill_into_an_occupied_slot_raises_and_changes_nothing(backend):
    a = SlotRequest(0, prompt(backend, "Today the weather is"))
    want = ids(alone(backend, a, 6))
    run = Run(backend)
    run.join(a)
    with pytest.raises(ValueError, match="occupied"):
        backend.prefill([SlotRequest(1, prompt(backend, "fine")), SlotRequest(0, prompt(backend, "again"))])
    with pytest.raises(ValueError, match="occupied"):
        backend.prefill([SlotRequest(2, (5,)), SlotRequest(2, (6,))])
    with pytest.raises(ValueError, match="no tokens"):
        backend.prefill([SlotRequest(3, ())])
    run.step(5)
    assert ids(run.out[0]) == want
    assert backend.prefill([SlotRequest(1, prompt(backend, "fine"))])  # slot 1 was left free


# -- (d) logprobs are the model's own log-softmax ------------------------------------------


def test_d_greedy_logprobs_match_the_full_sequence_forward(backend):
    request = SlotRequest(1, prompt(backend, "Today the weather is"), logprobs=3)
    run = Run(backend)
    run.join(SlotRequest(0, long_prompt(backend, 40)))
    run.step(2)
    run.join(request)  # with a batch-mate of another length, so the row is left-padded
    run.step(11)
    choices = run.out[1]
    sequence = list(request.prompt_ids) + ids(choices)
    with torch.inference_mode():
        logits = backend.model(torch.tensor([sequence])).logits[0].float()
    reference = torch.log_softmax(logits, dim=-1)
    for i, choice in enumerate(choices):
        row = reference[len(request.prompt_ids) - 1 + i]
        assert choice.token_id == int(row.argmax())
        assert choice.logprob == pytest.approx(float(row[choice.token_id]), abs=1e-4)
        assert len(choice.top_logprobs) == 3
        values = [value for _, value in choice.top_logprobs]
        assert values == sorted(values, reverse=True)
        assert choice.top_logprobs[0][0] == choice.token_id
        for token, value in choice.top_logprobs:
            assert value == pytest.approx(float(row[token]), abs=1e-4)
    assert all(choice.logprob is None and choice.top_logprobs == () for choice in run.out[0])


# -- (e) ignore_eos ------------------------------------------------------------------------


def test_e_ignore_eos_suppresses_eos(backend):
    (eos,) = backend.eos_token_ids
    texts = ["Today the weather is", "The", "Once upon a time", "hello", "a b c d", "It was"]
    hits = [p for p in (prompt(backend, t) for t in texts) if eos in ids(alone(backend, SlotRequest(0, p), 24))]
    assert hits, "precondition: some prompt's greedy continuation reaches EOS"
    for p in hits:
        greedy = ids(alone(backend, SlotRequest(0, p, ignore_eos=True), 24))
        sampled = ids(alone(backend, SlotRequest(0, p, SAMPLED, ignore_eos=True), 24))
        assert eos not in greedy and eos not in sampled
        # the tokens before the first EOS are unchanged
        plain = ids(alone(backend, SlotRequest(0, p), 24))
        cut = plain.index(eos)
        assert greedy[:cut] == plain[:cut]


# -- (f) rows of very different lengths in one step ----------------------------------------


def test_f_one_token_prompt_and_long_prompt_in_one_step(backend):
    short = SlotRequest(0, prompt(backend, "The")[:1], logprobs=0)
    long = SlotRequest(3, long_prompt(backend, 600), logprobs=0)
    want = {r.slot: alone(backend, r, 16) for r in (short, long)}
    run = Run(backend)
    run.join(short, long)
    run.step(15)
    for slot in (0, 3):
        assert ids(run.out[slot]) == ids(want[slot])
        for got, alone_choice in zip(run.out[slot], want[slot], strict=True):
            assert got.logprob == pytest.approx(alone_choice.logprob, abs=1e-4)


# -- kv_cache plumbing ---------------------------------------------------------------------


def test_kv_cache_stack_unpad_and_truncate_round_trip():
    torch.manual_seed(0)
    rows = [[(torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)) for _ in range(3)] for n in (1, 5, 3)]
    layers, mask = stack(rows, [1, 5, 3])
    assert mask.tolist() == [[0, 0, 0, 0, 1], [1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]
    cache = cache_of(layers)
    assert cache.get_seq_length() == 5
    for row, n in enumerate((1, 5, 3)):
        back = unpad_row(layers_of(cache), row, 5 - n)
        for (k, v), (k0, v0) in zip(back, rows[row], strict=True):
            assert torch.equal(k, k0) and torch.equal(v, v0)
        assert all(float(k[row, :, : 5 - n].abs().sum()) == 0 for k, _ in layers_of(cache))
    cache.update(torch.ones(3, 2, 1, 4), torch.ones(3, 2, 1, 4), 0)  # one layer appended, the others not
    cut = truncate(cache, 5)
    assert [k.shape[2] for k, _ in layers_of(cut)] == [5, 5, 5]
    assert cut.get_seq_length() == 5
