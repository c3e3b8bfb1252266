"""The sampling fields of issue 21 in the batched sampler (handler/sampling/): presence
and frequency penalties, logit_bias, min_tokens, the grammar mask, against hand-computed logits;
that a step without them takes the path it always took; and which backends refuse what
(nxdi's on-device sampler, sim)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from handler.backends import sim
from handler.backends.sim import SimBackend
from handler.config import ServingConfig
from handler.neuron.nxdi_config import device_sampling_refusal
from handler.request import Constraint, GenerationRequest, SamplingParams, SlotRequest, SlotRequestError
from handler.sampling import shaping
from handler.sampling.choice import choose_sorted, sorted_candidates
from handler.sampling.sampler import BatchSampler, _Workspace
from scripts.bench.per_slot_sampler import PerSlotSimModel
from tests.support.bench import FakeClock, sim_model_yaml

EOS = 3
VOCAB = 8


def slot(n: int, prompt=(5, 6, 7), logprobs: int | None = None, **fields) -> SlotRequest:
    """A SlotRequest: SlotRequest fields by name (ignore_eos, stop_token_ids, constraint), the
    rest SamplingParams."""
    own = {k: fields.pop(k) for k in ("ignore_eos", "stop_token_ids", "constraint") if k in fields}
    return SlotRequest(n, tuple(prompt), SamplingParams(**fields), logprobs=logprobs, **own)


def forcing(token: int, rows: int, vocab: int = VOCAB, margin: float = 50.0) -> torch.Tensor:
    """Logits under which every row's greedy pick is `token`, whatever penalty applies."""
    logits = torch.zeros(rows, vocab)
    logits[:, token] = margin
    return logits


def seen_logprobs(choice) -> dict[int, float]:
    """Every finite logprob of a greedy row that asked for the whole vocabulary's."""
    return dict(choice.top_logprobs)


def expected_logprobs(scores: list[float]) -> dict[int, float]:
    row = torch.tensor(scores)
    lp = torch.log_softmax(row, dim=-1)
    return {t: float(lp[t]) for t in range(len(scores)) if math.isfinite(scores[t])}


def assert_logprobs(choice, scores: list[float]) -> None:
    got, want = seen_logprobs(choice), expected_logprobs(scores)
    assert set(got) == set(want)
    for t, v in want.items():
        assert got[t] == pytest.approx(v, abs=1e-5), (t, got, want)


# -- presence / frequency -------------------------------------------------------------------------
def test_presence_and_frequency_penalties_change_exactly_the_generated_tokens() -> None:
    """Three rows generate 2, 2, 4 (tokens forced by their logits), then one step over flat logits:
    each generated token's logit is minus frequency x count + presence; the prompt's tokens (5, 6,
    7) and a batch-mate without penalties are untouched."""
    sampler = BatchSampler(4, {EOS}, 32)
    sampler.add(slot(0, presence_penalty=0.5, logprobs=VOCAB))
    sampler.add(slot(1, frequency_penalty=0.25, logprobs=VOCAB))
    sampler.add(slot(2, presence_penalty=0.5, frequency_penalty=0.25, logprobs=VOCAB))
    sampler.add(slot(3, logprobs=VOCAB))
    rows = [0, 1, 2, 3]
    for token in (2, 2, 4):
        assert [c.token_id for c in sampler.sample(rows, forcing(token, 4))] == [token] * 4
    logits = torch.zeros(4, VOCAB)
    logits[:, 1] = 1.0  # the flat row's favourite: stays the greedy pick
    choices = sampler.sample(rows, logits)
    base = [0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    presence, frequency, both = list(base), list(base), list(base)
    presence[2] -= 0.5
    presence[4] -= 0.5
    frequency[2] -= 2 * 0.25
    frequency[4] -= 1 * 0.25
    both[2] -= 2 * 0.25 + 0.5
    both[4] -= 1 * 0.25 + 0.5
    for choice, scores in zip(choices, [presence, frequency, both, base], strict=True):
        assert choice.token_id == 1
        assert_logprobs(choice, scores)


def test_a_frequency_penalty_spreads_a_greedy_row_over_its_favourites() -> None:
    sampler = BatchSampler(1, set(), 32)
    sampler.add(slot(0, frequency_penalty=1.5))
    logits = torch.tensor([[-5.0, 3.0, 2.0, 1.0, -5.0, -5.0, -5.0, -5.0]])
    picks = [sampler.sample([0], logits)[0].token_id for _ in range(6)]
    # tokens 1, 2, 3 at: (3, 2, 1) -> 1; (1.5, 2, 1) -> 2; (1.5, 0.5, 1) -> 1; (0, 0.5, 1) -> 3;
    # (0, 0.5, -0.5) -> 2; (0, -1, -0.5) -> 1
    assert picks == [1, 2, 1, 3, 2, 1]


def test_output_tables_grow_and_a_reused_slot_starts_clean(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shaping, "OUTPUT_TABLE_COLUMNS", 2)
    vocab = 40
    sampler = BatchSampler(2, set(), 8)
    sampler.add(slot(1, frequency_penalty=0.5, logprobs=vocab))
    order = [10, 11, 12, 13, 14, 10, 15, 16, 10]  # 7 distinct tokens: the tables grow twice
    for token in order:
        assert sampler.sample([1], forcing(token, 1, vocab))[0].token_id == token
    choice = sampler.sample([1], torch.zeros(1, vocab))[0]
    scores = [0.0] * vocab
    for token in order:
        scores[token] -= 0.5
    assert_logprobs(choice, scores)
    sampler.remove(1)
    sampler.add(slot(1, frequency_penalty=0.5, logprobs=vocab))  # a new request in the same slot
    assert_logprobs(sampler.sample([1], torch.zeros(1, vocab))[0], [0.0] * vocab)


def test_penalties_apply_in_order_repetition_then_output_then_bias() -> None:
    """repetition_penalty 2 (prompt token 6 at 4.0 -> 2.0; generated token 2 at 50 was forced,
    then at 1.0 -> 0.5), frequency 1 on token 2 (-> -0.5), bias +3 on token 6 (-> 5.0)."""
    sampler = BatchSampler(1, set(), 32)
    sampler.add(slot(0, repetition_penalty=2.0, frequency_penalty=1.0, logit_bias=((6, 3.0),), logprobs=VOCAB))
    assert sampler.sample([0], forcing(2, 1))[0].token_id == 2
    logits = torch.tensor([[0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 4.0, 0.0]])
    choice = sampler.sample([0], logits)[0]
    assert choice.token_id == 6
    assert_logprobs(choice, [0.0, 0.0, 0.5 - 1.0, 0.0, 0.0, 0.0, 4.0 / 2 + 3.0, 0.0])


# -- logit_bias ---------------------------------------------------------------------------------------
def test_logit_bias_bans_the_greedy_favourite_and_forces_a_token() -> None:
    sampler = BatchSampler(4, {EOS}, 32)
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.0, 5.0, 0.5, -3.0, 0.0]]).repeat(3, 1)
    sampler.add(slot(0))
    sampler.add(slot(1, logit_bias=((4, -100.0),)))
    sampler.add(slot(2, logit_bias=((6, 100.0), (4, -1.0))))
    assert [c.token_id for c in sampler.sample([0, 1, 2], logits)] == [4, 2, 6]


def test_logit_bias_holds_for_sampled_rows_too() -> None:
    sampler = BatchSampler(2, {EOS}, 32)
    sampler.add(slot(0, do_sample=True, temperature=1.5, seed=1, logit_bias=((4, -100.0), (1, -100.0))))
    sampler.add(slot(1, do_sample=True, temperature=1.5, top_k=5, seed=2, logit_bias=((6, 100.0),)))
    logits = torch.tensor([[0.0, 1.0, 2.0, 0.0, 5.0, 0.5, -3.0, 0.0]]).repeat(2, 1)
    banned, forced = [], []
    for _ in range(200):
        a, b = sampler.sample([0, 1], logits)
        banned.append(a.token_id)
        forced.append(b.token_id)
    assert not {1, 4} & set(banned) and len(set(banned)) >= 4  # it sampled, never a banned token
    assert set(forced) == {6}


# -- min_tokens ----------------------------------------------------------------------------------------
def test_min_tokens_suppresses_eos_and_stop_ids_until_reached_and_not_after() -> None:
    sampler = BatchSampler(3, {EOS}, 32)
    logits = torch.zeros(3, VOCAB)
    logits[:, EOS] = 9.0
    logits[:, 5] = 8.0  # a stop token id of rows 0 and 1
    logits[:, 1] = 1.0
    sampler.add(slot(0, min_tokens=3, stop_token_ids=(5,)))
    sampler.add(slot(1, min_tokens=1, stop_token_ids=(5,), do_sample=True, top_k=2, seed=4))
    sampler.add(slot(2, stop_token_ids=(5,)))  # no min_tokens: EOS at once
    steps = [[c.token_id for c in sampler.sample([0, 1, 2], logits)] for _ in range(5)]
    assert [s[0] for s in steps] == [1, 1, 1, EOS, EOS]
    assert steps[0][1] == 1 and all(s[1] in (EOS, 5) for s in steps[1:])  # top_k 2 of EOS, 5 after it
    assert [s[2] for s in steps] == [EOS] * 5


def test_min_tokens_with_ignore_eos_still_suppresses_eos_after_it() -> None:
    sampler = BatchSampler(1, {EOS}, 32)
    sampler.add(slot(0, min_tokens=2, stop_token_ids=(5,), ignore_eos=True))
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS], logits[0, 5], logits[0, 1] = 9.0, 8.0, 1.0
    assert [sampler.sample([0], logits)[0].token_id for _ in range(4)] == [1, 1, 5, 5]


# -- the fast path ---------------------------------------------------------------------------------------
class SpyWorkspace(_Workspace):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def get(self, name: str, rows: int, columns: int) -> torch.Tensor:
        self.names.append(name)
        return super().get(name, rows, columns)


def test_a_step_without_the_new_fields_copies_nothing_and_picks_what_it_picks_with_shaped_mates() -> None:
    plain = [
        {"do_sample": True, "temperature": 0.9, "top_p": 0.95, "seed": 11},
        {},
        {"do_sample": True, "top_k": 20, "seed": 12},
    ]
    vocab = 300
    g = torch.Generator().manual_seed(5)
    stream = [torch.randn(vocab, generator=g) * 2 for _ in range(25)]

    def run(extra: list[dict]) -> tuple[list[list[int]], list[str]]:
        sampler = BatchSampler(8, {EOS}, 64)
        spy = sampler._workspace = SpyWorkspace()
        for n, params in enumerate(plain + extra):
            sampler.add(slot(n, **params))
        rows = list(range(len(plain) + len(extra)))
        out: list[list[int]] = [[] for _ in plain]
        for logits in stream:
            picks = sampler.sample(rows, logits.expand(len(rows), vocab).contiguous())
            for row, choice in zip(out, picks, strict=False):
                row.append(choice.token_id)
        return out, spy.names

    alone, names = run([])
    assert "scores" not in names  # the caller's logits are read as they are
    mates = [
        {"frequency_penalty": 1.0},
        {"logit_bias": ((7, 100.0),), "do_sample": True, "seed": 3},
        {"min_tokens": 10, "stop_token_ids": (9,)},
    ]
    crowded, names = run(mates)
    assert "scores" in names
    assert crowded == alone
    assert len(set(alone[0])) > 3  # it really sampled


def test_min_tokens_rows_leave_the_copy_once_reached() -> None:
    sampler = BatchSampler(1, {EOS}, 32)
    spy = sampler._workspace = SpyWorkspace()
    sampler.add(slot(0, min_tokens=2))
    for _ in range(4):
        sampler.sample([0], torch.randn(1, VOCAB))
    assert spy.names.count("scores") == 2


# -- the grammar mask, with the tiny model's tokenizer ----------------------------------------------------
@pytest.fixture
def grammar_sampler(tiny_tokenizer):
    sampler = BatchSampler(8, {tiny_tokenizer.eos_token_id}, 256, tiny_tokenizer, len(tiny_tokenizer))
    sampler.warmup()
    return sampler


def run_until_eos(sampler: BatchSampler, slots: list[int], vocab: int, seed: int, limit: int = 200):
    """Random logits each step; each slot's tokens (EOS included) and choices."""
    eos = int(sampler.eos_token_ids[0])
    g = torch.Generator().manual_seed(seed)
    live, out = list(slots), {s: [] for s in slots}
    for _ in range(limit):
        if not live:
            break
        choices = sampler.sample(live, torch.randn(len(live), vocab, generator=g) * 4)
        for s, choice in zip(list(live), choices, strict=True):
            out[s].append(choice)
            if choice.token_id == eos:
                live.remove(s)
    assert not live, "a constrained row never ended"
    return {s: [c.token_id for c in cs] for s, cs in out.items()}, out


def allowed_tokens(tokenizer, constraint: Constraint, prefix: list[int] = ()) -> set[int]:
    from handler.grammar.masks import GrammarMasks

    masks = GrammarMasks(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    masks.add(0, constraint)
    masks.advance([0] * len(prefix), list(prefix))
    scores = torch.zeros(1, len(tokenizer))
    masks.mask(scores, [0], [0])
    return set(torch.nonzero(scores[0] == 0).flatten().tolist())


def test_a_regex_constrains_greedy_and_sampled_rows_of_random_logits(grammar_sampler, tiny_tokenizer) -> None:
    digits = Constraint("regex", "[0-9]{3}")
    vocab = len(tiny_tokenizer)
    grammar_sampler.add(slot(0, constraint=digits))
    grammar_sampler.add(slot(1, constraint=digits, do_sample=True, temperature=1.3, seed=7))
    grammar_sampler.add(slot(2, constraint=digits, do_sample=True, top_k=50, top_p=0.9, seed=8))
    grammar_sampler.add(slot(3))  # an unconstrained batch-mate
    tokens, _ = run_until_eos(grammar_sampler, [0, 1, 2], vocab, seed=1)
    eos = tiny_tokenizer.eos_token_id
    for s in (0, 1, 2):
        assert tokens[s][-1] == eos
        assert re.fullmatch("[0-9]{3}", tiny_tokenizer.decode(tokens[s][:-1])), tokens[s]
    # without the grammar, random logits give anything but digits
    g = torch.Generator().manual_seed(1)
    unconstrained = [grammar_sampler.sample([3], torch.randn(1, vocab, generator=g) * 4)[0].token_id for _ in range(4)]
    assert not re.fullmatch("[0-9]*", tiny_tokenizer.decode(unconstrained))


SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "colour": {"enum": ["red", "green", "blue"]},
        "member": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["name", "age", "colour", "member", "tags"],
    "additionalProperties": False,
}


def test_a_json_schema_gives_valid_json_that_validates(grammar_sampler, tiny_tokenizer) -> None:
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    for n in range(4):
        grammar_sampler.add(slot(n, constraint=constraint, do_sample=n > 0, temperature=1.2, seed=n))
    tokens, _ = run_until_eos(grammar_sampler, [0, 1, 2, 3], len(tiny_tokenizer), seed=2, limit=400)
    for s in range(4):
        document = json.loads(tiny_tokenizer.decode(tokens[s][:-1]))
        assert set(document) == set(SCHEMA["required"])
        assert isinstance(document["name"], str) and len(document["name"]) <= 12
        assert type(document["age"]) is int and 0 <= document["age"] <= 130
        assert document["colour"] in ("red", "green", "blue")
        assert type(document["member"]) is bool
        assert isinstance(document["tags"], list) and len(document["tags"]) <= 3
        assert all(isinstance(t, str) and len(t) <= 4 for t in document["tags"])


def test_json_object_mode_gives_one_json_object(grammar_sampler, tiny_tokenizer) -> None:
    grammar_sampler.add(slot(0, constraint=Constraint("json_object"), do_sample=True, seed=3))
    grammar_sampler.add(slot(1, constraint=Constraint("json_object")))
    tokens, _ = run_until_eos(grammar_sampler, [0, 1], len(tiny_tokenizer), seed=4, limit=256)
    for s in (0, 1):
        assert isinstance(json.loads(tiny_tokenizer.decode(tokens[s][:-1])), dict)


def test_logprobs_of_a_constrained_row_are_over_the_allowed_tokens_only(grammar_sampler, tiny_tokenizer) -> None:
    constraint = Constraint("regex", "[0-9]{2}")
    allowed = allowed_tokens(tiny_tokenizer, constraint)
    assert 5 < len(allowed) < 40
    vocab = len(tiny_tokenizer)
    grammar_sampler.add(slot(0, constraint=constraint, logprobs=vocab))
    grammar_sampler.add(slot(1, constraint=constraint, logprobs=vocab, do_sample=True, seed=1))
    grammar_sampler.add(slot(2, constraint=constraint, logprobs=vocab, do_sample=True, top_k=60, seed=2))
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(9)) * 3
    for choice, row in zip(grammar_sampler.sample([0, 1, 2], logits), logits, strict=True):
        alternatives = dict(choice.top_logprobs)
        assert set(alternatives) == allowed and choice.token_id in allowed
        assert sum(math.exp(v) for v in alternatives.values()) == pytest.approx(1.0, abs=1e-5)
        want = torch.log_softmax(row[sorted(allowed)], dim=-1)  # the model's own, renormalized over the allowed
        assert choice.logprob == pytest.approx(float(want[sorted(allowed).index(choice.token_id)]), abs=1e-5)


def test_the_grammar_wins_over_min_tokens(grammar_sampler, tiny_tokenizer) -> None:
    """Once the output is complete the grammar allows EOS alone, which min_tokens suppresses: the
    row is redone with the mask alone and ends, rather than picking from an all -inf row."""
    grammar_sampler.add(slot(0, constraint=Constraint("regex", "[a-z]"), min_tokens=5))
    grammar_sampler.add(slot(1, constraint=Constraint("regex", "[0-9]+"), min_tokens=4, do_sample=True, seed=5))
    tokens, _ = run_until_eos(grammar_sampler, [0, 1], len(tiny_tokenizer), seed=6)
    assert len(tokens[0]) == 2 and re.fullmatch("[a-z]", tiny_tokenizer.decode(tokens[0][:1]))
    # [0-9]+ may end after any digit: min_tokens holds EOS back until 4 tokens, the grammar permitting
    assert len(tokens[1]) >= 5 and re.fullmatch("[0-9]+", tiny_tokenizer.decode(tokens[1][:-1]))


def test_a_bad_grammar_raises_at_add_and_leaves_nothing_behind(grammar_sampler) -> None:
    with pytest.raises(ValueError):
        grammar_sampler.add(slot(0, constraint=Constraint("regex", "[0-9")))
    assert 0 not in grammar_sampler._slots
    grammar_sampler.add(slot(0))  # the slot serves the next request as usual
    assert len(grammar_sampler.sample([0], torch.randn(1, grammar_sampler._shaper.vocab_size))) == 1


def test_a_slot_reused_without_a_constraint_is_not_masked(grammar_sampler, tiny_tokenizer) -> None:
    vocab = len(tiny_tokenizer)
    grammar_sampler.add(slot(0, constraint=Constraint("regex", "[0-9]")))
    grammar_sampler.sample([0], torch.randn(1, vocab))
    grammar_sampler.remove(0)
    grammar_sampler.add(slot(0))
    logits = torch.zeros(1, vocab)
    logits[0, 100] = 5.0
    assert grammar_sampler.sample([0], logits)[0].token_id == 100


def test_without_a_tokenizer_a_constraint_is_refused_and_add_fails() -> None:
    sampler = BatchSampler(2, {EOS}, 16)
    request = GenerationRequest("hi", 4, constraint=Constraint("regex", "a"))
    refusal = sampler.refusal(request)
    assert refusal is not None and refusal[0] == "constraint"
    assert sampler.refusal(GenerationRequest("hi", 4)) is None
    with pytest.raises(ValueError, match="constraint"):
        sampler.add(slot(0, constraint=Constraint("regex", "a")))


def test_a_masked_row_resolves_among_the_candidates_whatever_its_top_k() -> None:
    """A row with fewer tokens of nonzero probability than the candidates holds all its mass:
    the pick is resolved there, with top_k or top_p past the allowed set (no full sort)."""
    vocab = 1000
    probs = torch.zeros(3, vocab)
    probs[:, [10, 500, 900]] = torch.tensor([0.5, 0.3, 0.2])
    values, ids, safe = sorted_candidates(probs, 8)
    assert list(safe) == [vocab] * 3
    result = choose_sorted(
        values, safe, np.array([50, 0, 0]), np.array([1.0, 0.95, 1.0]), np.array([0.6, 0.9, 0.99]), vocab
    )
    assert result.resolved.all()
    assert [int(ids[r, result.position[r]]) for r in range(3)] == [500, 900, 900]


# -- refusals -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sampling_fields", "extra", "field"),
    [
        ({"presence_penalty": 0.5}, {}, "presence_penalty"),
        ({"frequency_penalty": -0.5}, {}, "frequency_penalty"),
        ({"logit_bias": ((5, -100.0),)}, {}, "logit_bias"),
        ({"min_tokens": 3}, {}, "min_tokens"),
        ({}, {"constraint": Constraint("json_object")}, "constraint"),
    ],
)
def test_on_device_sampling_refuses_the_fields_it_cannot_honour(sampling_fields, extra, field) -> None:
    request = GenerationRequest("hi", 4, SamplingParams(**sampling_fields), **extra)
    refusal = device_sampling_refusal(request, 256)
    assert refusal is not None and refusal[0] == field
    assert "on_device_sampling" in refusal[1]


def test_on_device_sampling_honours_stop_token_ids() -> None:
    """They end a sequence on the host, whatever picked the token."""
    assert device_sampling_refusal(GenerationRequest("hi", 4, stop_token_ids=(5, 9)), 256) is None


def sim_backend(model_dir: Path, **sim) -> SimBackend:
    config = ServingConfig.from_model_yaml(sim_model_yaml(model_dir, **{"time_scale": 1.0, **sim}))
    backend = SimBackend(config.handler, model_dir, model_dir, clock=FakeClock())
    backend.warmup()
    return backend


def per_slot_sim_backend(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> SimBackend:
    """The sim with the bench's per-slot baseline sampler (P2s's served baseline)."""
    with monkeypatch.context() as patched:
        patched.setattr(sim, "SimModel", PerSlotSimModel)
        return sim_backend(model_dir)


def test_sim_refuses_logit_bias_and_a_constraint_with_the_per_slot_baseline(tiny_model_dir, monkeypatch) -> None:
    constrained = GenerationRequest("hi", 4, constraint=Constraint("regex", "[0-9]"))
    biased = GenerationRequest("hi", 4, SamplingParams(logit_bias=((5, 100.0),)))
    penalized = GenerationRequest("hi", 4, SamplingParams(presence_penalty=1.0, frequency_penalty=1.0, min_tokens=2))
    baseline = per_slot_sim_backend(tiny_model_dir, monkeypatch)
    refusal = baseline.request_refusal(constrained)
    assert (
        refusal is not None
        and refusal[0] == "constraint"
        and "per-slot sampler is the benchmark baseline" in refusal[1]
    )
    with pytest.raises(SlotRequestError, match="no grammar mask"):
        baseline.prefill([SlotRequest(0, (5, 6), constraint=Constraint("regex", "[0-9]"))])
    batched = sim_backend(tiny_model_dir)
    assert batched.request_refusal(constrained) is None
    for backend in (baseline, batched):
        refusal = backend.request_refusal(biased)
        assert refusal is not None and refusal[0] == "logit_bias"
        assert backend.request_refusal(penalized) is None


def test_a_replicas_worker_refuses_what_its_replicas_backend_refuses(tiny_model_dir, monkeypatch) -> None:
    """With scheduler.replicas the worker has no backend: it answers from the facts replica 0
    reported at start, field by field, exactly as the backend answers."""
    from types import SimpleNamespace

    from handler.replicas.child import facts_of
    from handler.replicas.model import ReplicatedModel

    requests = [
        GenerationRequest("hi", 4, constraint=Constraint("regex", "[0-9]")),
        GenerationRequest("hi", 4, SamplingParams(logit_bias=((5, 100.0),))),
        GenerationRequest("hi", 4, SamplingParams(presence_penalty=1.0, min_tokens=2)),
        GenerationRequest("hi", 4, SamplingParams(do_sample=True, seed=3)),
    ]
    for backend in (per_slot_sim_backend(tiny_model_dir, monkeypatch), sim_backend(tiny_model_dir)):
        worker = ReplicatedModel(SimpleNamespace(facts=facts_of(backend)), backend.tokenizer)
        assert [worker.request_refusal(r) for r in requests] == [backend.request_refusal(r) for r in requests]
        assert worker.request_refusal(requests[1]) is not None  # the test sees a refusal, not only agreement


def test_sim_serves_a_constraint_from_its_sampler(tiny_model_dir) -> None:
    backend = sim_backend(tiny_model_dir, mean_natural_tokens=2)  # its simulated EOS would come early
    eos = backend.tokenizer.eos_token_id
    constraint = Constraint("regex", "[0-9]{4}-[a-z]{2}")
    requests = [
        SlotRequest(0, (5, 6), SamplingParams(), constraint=constraint),
        SlotRequest(3, (7, 8), SamplingParams(do_sample=True, temperature=1.2, seed=2), constraint=constraint),
    ]
    out = {r.slot: [c.token_id] for r, c in zip(requests, backend.prefill(requests), strict=True)}
    for _ in range(20):
        live = [s for s in out if out[s][-1] != eos]
        if not live:
            break
        for s, choice in zip(live, backend.decode(live), strict=True):
            out[s].append(choice.token_id)
    for tokens in out.values():
        assert tokens[-1] == eos
        assert re.fullmatch("[0-9]{4}-[a-z]{2}", backend.tokenizer.decode(tokens[:-1])), tokens


def test_sim_holds_eos_and_stop_ids_back_until_min_tokens(tiny_model_dir) -> None:
    backend = sim_backend(tiny_model_dir, mean_natural_tokens=2)
    eos = backend.tokenizer.eos_token_id
    vocab_ids = backend.model.vocab_ids
    stop = tuple(vocab_ids[: len(vocab_ids) // 2])  # half the vocabulary: drawn at once without min_tokens
    for seed, do_sample in ((1, False), (2, True)):
        sampling = SamplingParams(do_sample=do_sample, seed=seed, min_tokens=12)
        request = SlotRequest(0, (5, 6, seed), sampling, stop_token_ids=stop)
        tokens = [backend.prefill([request])[0].token_id]
        tokens += [backend.decode([0])[0].token_id for _ in range(11)]
        backend.release(0)
        assert not {eos, *stop} & set(tokens)


def test_the_hf_backend_serves_a_json_schema_with_the_tiny_random_model(tiny_model_dir) -> None:
    """The backend wiring: its sampler gets the tokenizer and the vocabulary, warm-up builds the
    masks, a constrained slot's output validates, an unconstrained batch-mate's is the model's."""
    from handler.backends.hf import HFBackend
    from handler.config import HandlerConfig

    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(tiny_model_dir), cpu_threads=1), tiny_model_dir, 2)
    backend.warmup()
    constraint = Constraint("json_schema", json.dumps(SCHEMA))
    assert backend.request_refusal(GenerationRequest("hi", 4, constraint=constraint)) is None
    prompt = tuple(backend.encode("Describe a person as JSON:"))
    requests = [SlotRequest(0, prompt, constraint=constraint), SlotRequest(1, prompt, ignore_eos=True)]
    out = {r.slot: [c.token_id] for r, c in zip(requests, backend.prefill(requests), strict=True)}
    eos = backend.tokenizer.eos_token_id
    while out[0][-1] != eos and len(out[0]) < 200:
        for s, choice in zip((0, 1), backend.decode([0, 1]), strict=True):
            out[s].append(choice.token_id)
    document = json.loads(backend.tokenizer.decode(out[0][:-1]))
    assert set(document) == set(SCHEMA["required"])
    with pytest.raises(json.JSONDecodeError):
        json.loads(backend.tokenizer.decode(out[1]))


def test_a_grammar_the_engine_gives_up_on_mid_output_fails_that_row_alone(grammar_sampler, tiny_tokenizer) -> None:
    """The matcher errs in a step (here: it is handed a token its grammar forbids, as a parser that
    runs out of its limits does by itself): that row's choice is EOS and carries the reason; its
    batch-mate is untouched; the reason is one line, never the grammar or a state dump."""
    vocab = len(tiny_tokenizer)
    digits = Constraint("regex", "[0-9]+")
    grammar_sampler.add(slot(0, constraint=digits))
    grammar_sampler.add(slot(1, constraint=digits))
    forbidden = tiny_tokenizer.convert_tokens_to_ids("a")
    grammar_sampler._shaper._masks._matchers[0].consume_token(forbidden)
    first, second = grammar_sampler.sample([0, 1], torch.randn(2, vocab))
    assert first.token_id == tiny_tokenizer.eos_token_id and first.constraint_failure
    assert "\n" not in first.constraint_failure and "[0-9]" not in first.constraint_failure
    assert second.constraint_failure is None and tiny_tokenizer.decode([second.token_id]).isdigit()
