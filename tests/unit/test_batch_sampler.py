"""The batched sampler against an exact full-vocabulary reference, its seeds, and its
distribution (handler/sampling/)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from handler.request import SamplingParams, SlotRequest
from handler.sampling.choice import argmax_rows, choose_sorted, sorted_candidates
from handler.sampling.sampler import BatchSampler
from scripts.bench.per_slot_sampler import PerSlotSampler

EOS = 3


def reference_token(probs: torch.Tensor, top_k: int, top_p: float, draw: float) -> tuple[int, int, float]:
    """The exact computation, written plainly: the whole row sorted (descending, ties by id),
    masses summed in order in float64, top-k by rank, top-p keeping a token while the mass
    before it is below top_p (of the top-k mass), then the first kept token whose cumulative
    mass passes draw x kept mass. Returns (token, tokens kept, kept mass)."""
    vocab = probs.shape[0]
    values, ids = torch.sort(probs, descending=True, stable=True)
    cumulative, total = [], 0.0
    for p in values.tolist():
        total += p
        cumulative.append(total)
    k = top_k if 0 < top_k < vocab else vocab
    k_mass = cumulative[k - 1] if 0 < top_k < vocab else 1.0
    kept = 0
    for j in range(k):
        before = cumulative[j - 1] if j else 0.0
        if top_p < 1.0 and not before < top_p * k_mass:
            break
        kept += 1
    mass = cumulative[kept - 1] if top_p < 1.0 else k_mass
    for j in range(kept):
        if cumulative[j] > draw * mass:
            return int(ids[j]), kept, mass
    return int(ids[kept - 1]), kept, mass


def batched_tokens(probs: torch.Tensor, top_k: list[int], top_p: list[float], draws: list[float], tiers=(4, 16)):
    """The sampler's tiered path on `probs` rows: candidates, then larger ones, then the full sort."""
    rows, vocab = probs.shape
    out: dict[int, int] = {}
    pending = np.arange(rows)
    k, p, d = np.array(top_k), np.array(top_p, dtype=np.float64), np.array(draws, dtype=np.float64)
    for count in (*tiers, vocab):
        values, ids, safe = sorted_candidates(probs[torch.from_numpy(pending)], min(count, vocab))
        result = choose_sorted(values, safe, k[pending], p[pending], d[pending], vocab)
        for r in np.flatnonzero(result.resolved):
            out[int(pending[r])] = int(ids[r, result.position[r]])
        pending = pending[~result.resolved]
        if not len(pending):
            break
    return [out[r] for r in range(rows)]


def random_probs(rows: int, vocab: int, generator: torch.Generator, peaked: bool) -> torch.Tensor:
    logits = torch.randn(rows, vocab, generator=generator) * (4.0 if peaked else 1.0)
    return torch.softmax(logits, dim=-1)


@pytest.mark.parametrize("peaked", [True, False])
def test_tiered_pick_equals_the_exact_full_sort_for_the_same_draw(peaked: bool) -> None:
    g = torch.Generator().manual_seed(1 if peaked else 2)
    vocab, rows = 50, 400
    probs = random_probs(rows, vocab, g, peaked)
    top_k = [int(x) for x in torch.randint(0, 12, (rows,), generator=g)]  # 0 (off) included
    top_p = [float(x) for x in torch.rand(rows, generator=g) * 0.8 + 0.2]
    top_p = [1.0 if i % 5 == 0 else p for i, p in enumerate(top_p)]  # top-p off on some rows
    draws = [float(x) for x in torch.rand(rows, generator=g)]
    got = batched_tokens(probs, top_k, top_p, draws)
    want = [reference_token(probs[r], top_k[r], top_p[r], draws[r])[0] for r in range(rows)]
    assert got == want


def test_top_p_boundaries_ties_and_degenerate_rows() -> None:
    vocab = 12
    rows = [
        torch.tensor([0.5, 0.3, 0.1, 0.1] + [0.0] * 8),  # cumulative hits top_p exactly at a boundary
        torch.full((vocab,), 1 / vocab),  # every token tied
        torch.tensor([0.0] * 11 + [1.0]),  # all mass on the last id (all -inf but one)
        torch.tensor([0.25, 0.25, 0.25, 0.25] + [0.0] * 8),  # a tie across the candidate edge
    ]
    probs = torch.stack(rows)
    for top_k in (0, 1, 2, 3, 5, vocab, vocab + 7):  # vocab + 7: top-k above the vocabulary is off
        for top_p in (0.1, 0.5, 0.8, 0.9, 0.99, 1.0):
            for draw in (0.0, 0.2, 0.5, 0.6249, 0.625, 0.8, 0.999999):
                n = len(rows)
                got = batched_tokens(probs, [top_k] * n, [top_p] * n, [draw] * n, tiers=(2, 3))
                want = [reference_token(probs[r], top_k, top_p, draw)[0] for r in range(n)]
                assert got == want, (top_k, top_p, draw)


def test_top_k_above_the_vocabulary_samples_the_whole_vocabulary() -> None:
    probs = torch.softmax(torch.zeros(1, 8), dim=-1)
    seen = {batched_tokens(probs, [100], [1.0], [d])[0] for d in [i / 8 + 0.01 for i in range(8)]}
    assert seen == set(range(8))


def request(slot: int, prompt=(5, 6, 7), **sampling) -> SlotRequest:
    return SlotRequest(slot=slot, prompt_ids=tuple(prompt), sampling=SamplingParams(**sampling))


def test_greedy_rows_take_the_argmax_after_penalty_and_eos_suppression() -> None:
    sampler = BatchSampler(4, {EOS}, 64)
    logits = torch.zeros(3, 10)
    logits[:, EOS] = 5.0
    logits[:, 6] = 4.0  # in the prompt: a penalty of 2 halves it
    logits[:, 8] = 3.0
    sampler.add(request(0))
    sampler.add(request(1, repetition_penalty=2.0))
    sampler.add(SlotRequest(2, (5, 6, 7), SamplingParams(repetition_penalty=2.0), ignore_eos=True))
    assert [c.token_id for c in sampler.sample([0, 1, 2], logits)] == [EOS, EOS, 8]
    assert float(logits[0, 6]) == 4.0  # the caller's logits are left alone


def test_argmax_by_blocks_equals_torch_argmax_ties_included() -> None:
    g = torch.Generator().manual_seed(3)
    for rows, vocab in ((6, 1000), (6, 32000), (20, 32000), (6, 128256), (5, 128011)):  # small: plain; large: blocks
        scores = torch.randint(0, 50, (rows, vocab), generator=g).float()  # many ties
        assert torch.equal(argmax_rows(scores), scores.argmax(dim=-1))


def test_temperature_near_zero_picks_the_argmax() -> None:
    sampler = BatchSampler(2, set(), 16)
    sampler.add(request(0, do_sample=True, temperature=1e-4, seed=1))
    logits = torch.tensor([[1.0, 2.0, 2.5, 0.5]])
    assert all(sampler.sample([0], logits)[0].token_id == 2 for _ in range(20))


def test_repetition_penalty_history_grows_with_the_generated_tokens() -> None:
    sampler = BatchSampler(1, set(), 8)
    sampler.add(request(0, prompt=(1,), repetition_penalty=100.0))
    logits = torch.tensor([[0.0, 1.0, 5.0, 4.0, 3.0, 2.0]])
    # Each pick is penalized from then on: 2, then 3, then 4, then 5 (1 was in the prompt).
    assert [sampler.sample([0], logits)[0].token_id for _ in range(4)] == [2, 3, 4, 5]
    # Past the n_positions it was sized for (8), the history grows rather than failing, and keeps
    # every token: the prompt's, then each pick.
    picks = [sampler.sample([0], logits)[0].token_id for _ in range(10)]
    history = sampler._history[0, : sampler._slots[0].history_len].tolist()
    assert history == [1, 2, 3, 4, 5, *picks]


def seeded_run(slots_and_mates: list[tuple[int, dict]], steps: int, vocab: int = 300) -> list[list[int]]:
    """Tokens of every row over `steps` steps; every row sees the same logits stream per step."""
    g = torch.Generator().manual_seed(0)
    stream = [torch.randn(vocab, generator=g) * 2 for _ in range(steps)]
    sampler = BatchSampler(8, {EOS}, 128)
    for slot, params in slots_and_mates:
        sampler.add(request(slot, **params))
    slots = [slot for slot, _ in slots_and_mates]
    out: list[list[int]] = [[] for _ in slots]
    for logits in stream:
        picks = sampler.sample(slots, logits.expand(len(slots), vocab).contiguous())
        for row, choice in zip(out, picks, strict=True):
            row.append(choice.token_id)
    return out


def test_a_seeded_request_gets_the_same_tokens_whatever_its_batch_mates_and_slot() -> None:
    mine = {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "seed": 1234}
    alone = seeded_run([(0, mine)], 30)[0]
    mates = [
        {"do_sample": True, "temperature": 1.3, "seed": 7},
        {},
        {"do_sample": True, "top_k": 5, "repetition_penalty": 1.3},
    ]
    crowded = seeded_run([(5, mates[0]), (2, mates[1]), (7, mine), (1, mates[2])], 30)[2]
    assert crowded == alone
    assert len(set(alone)) > 3  # it really sampled


def test_unseeded_requests_differ() -> None:
    params = {"do_sample": True, "temperature": 1.5}
    a, b = seeded_run([(0, params), (1, params)], 20)
    assert a != b


def test_sampled_frequencies_match_the_softmax_probabilities() -> None:
    """Chi-squared goodness of fit of 20,000 draws against softmax(logits / T) after top-p."""
    logits = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -4.0])
    temperature, top_p = 0.8, 0.9
    sampler = BatchSampler(8, set(), 16)
    for slot in range(8):
        sampler.add(request(slot, do_sample=True, temperature=temperature, top_p=top_p, seed=slot))
    counts: Counter[int] = Counter()
    for _ in range(2500):
        for choice in sampler.sample(list(range(8)), logits.expand(8, -1).contiguous()):
            counts[choice.token_id] += 1
    probs = torch.softmax(logits / temperature, dim=-1)
    values, ids = torch.sort(probs, descending=True)
    before = torch.cat([torch.zeros(1), values.cumsum(0)[:-1]])
    kept = ids[before < top_p].tolist()
    expected = probs[kept] / probs[kept].sum()
    total = sum(counts.values())
    assert set(counts) <= set(kept)  # nothing outside the nucleus
    chi2 = sum((counts[t] - total * float(e)) ** 2 / (total * float(e)) for t, e in zip(kept, expected, strict=True))
    # 99.9th percentile of chi-squared with len(kept) - 1 degrees of freedom (<= 6 here): 22.5
    assert chi2 < 22.5, (chi2, counts, expected)


def test_batched_and_per_slot_samplers_draw_from_the_same_distribution() -> None:
    """The per-slot sampler (transformers' processors) and the batched one agree in distribution
    on top-k + top-p + temperature (not draw for draw: they consume their generators differently)."""
    logits = torch.tensor([1.0, 0.8, 0.3, 0.0, -0.2, -1.0])
    params = {"do_sample": True, "temperature": 0.7, "top_k": 4, "top_p": 0.85}
    freq = {}
    for cls in (BatchSampler, PerSlotSampler):
        sampler = cls(4, set(), 16)
        for slot in range(4):
            sampler.add(request(slot, seed=100 + slot, **params))
        counts: Counter[int] = Counter()
        for _ in range(2000):
            counts.update(c.token_id for c in sampler.sample(list(range(4)), logits.expand(4, -1).contiguous()))
        freq[cls.__name__] = {t: counts[t] / 8000 for t in range(6)}
    for t in range(6):
        assert freq["BatchSampler"][t] == pytest.approx(freq["PerSlotSampler"][t], abs=0.025), t


def test_logprobs_are_those_of_the_distribution_drawn_from() -> None:
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0]])
    sampler = BatchSampler(2, set(), 16)
    sampler.add(SlotRequest(0, (1,), SamplingParams(do_sample=True, top_k=2, seed=3), logprobs=4))
    sampler.add(SlotRequest(1, (1,), SamplingParams(), logprobs=2))
    sampled, greedy = sampler.sample([0, 1], torch.cat([logits, logits]))
    kept = torch.log_softmax(logits[0, :2], dim=-1)
    assert sampled.token_id in (0, 1)
    assert sampled.logprob == pytest.approx(float(kept[sampled.token_id]), abs=1e-6)
    assert [t for t, _ in sampled.top_logprobs] == [0, 1]  # only the kept tokens are alternatives
    full = torch.log_softmax(logits[0], dim=-1)
    assert greedy.token_id == 0 and greedy.logprob == pytest.approx(float(full[0]), abs=1e-6)
    assert greedy.top_logprobs[0] == (0, greedy.logprob)  # the same float, as lm-eval's is_greedy compares


def test_padded_vocabulary_columns_are_never_chosen() -> None:
    """A device may pad the vocabulary (neuronx for tp_degree): the sampler reads a strided view."""
    sampler = BatchSampler(2, set(), 16)
    sampler.add(request(0, do_sample=True, seed=5))
    sampler.add(request(1))  # greedy
    vocab = 2000  # wide enough for the greedy rows' block argmax
    logits = torch.cat([torch.randn(2, vocab), torch.full((2, 8), 50.0)], dim=1)  # 8 padding columns, huge
    for _ in range(20):
        sampled, greedy = sampler.sample([0, 1], logits, vocab_size=vocab)
        assert sampled.token_id < vocab and greedy.token_id == int(logits[1, :vocab].argmax())


def test_an_entropy_sanity_check_of_the_full_vocabulary_path() -> None:
    """Plain temperature sampling (no top-k / top-p) over a flat 5,000-token row: the picks come
    from the full sort fallback often, and they spread over the vocabulary."""
    sampler = BatchSampler(4, set(), 16)
    for slot in range(4):
        sampler.add(request(slot, do_sample=True, seed=slot))
    logits = torch.zeros(4, 5000)
    picks = [c.token_id for _ in range(50) for c in sampler.sample(list(range(4)), logits)]
    assert len(set(picks)) > 150  # 200 draws from 5,000 equally likely tokens: ~196 distinct
    assert max(picks) > 4000 and min(picks) < 1000
