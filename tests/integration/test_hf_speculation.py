"""Issue 45, prompt-lookup speculation on the hf backend and the tiny model: with k = 1..5 proposed
tokens a row, every sequence's tokens are exactly those of one token a step (greedy rows speculate;
sampled, penalised and logprob rows take one token in the same forward), the proposals were really
taken (fewer steps than tokens), and max_tokens and stop strings cut where they did before."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.engine.ngram import NgramProposer
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine
from handler.request import GenerationRequest, SamplingParams

N_SLOTS = 4
# Copy-heavy prompts: text the output can repeat (and the tiny model's greedy loops repeat themselves).
PROMPTS = (
    "the cat sat on the mat. the cat sat on the mat. the cat sat on",
    "1 2 3 4 5 1 2 3 4 5 1 2 3",
    "Hello world",
)


def requests() -> list[GenerationRequest]:
    greedy = [GenerationRequest(prompt, 40, ignore_eos=True) for prompt in PROMPTS]
    others = [
        GenerationRequest(PROMPTS[0], 24, sampling=SamplingParams(do_sample=True, temperature=0.8, seed=7)),
        GenerationRequest(PROMPTS[1], 24, logprobs=2, ignore_eos=True),
        GenerationRequest(PROMPTS[2], 24, sampling=SamplingParams(repetition_penalty=1.3)),
        GenerationRequest(PROMPTS[0], 13, ignore_eos=True),  # max_tokens mid-proposal
        GenerationRequest(PROMPTS[0], 40, stop=(" mat",), ignore_eos=True),
    ]
    return greedy + others


def run(model_dir: Path, k: int) -> tuple[list[Sequence], int]:
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(model_dir), cpu_threads=1), model_dir, N_SLOTS, k)
    engine = StepEngine(backend, 10_000, proposer=NgramProposer(k, 1, 3) if k else None)
    sequences = []
    for i, request in enumerate(requests()):
        prompt_ids = backend.encode(request.prompt)
        sequence = Sequence(request, prompt_ids, backend.tokenizer, backend.eos_token_ids, f"r{i}")
        sequences.append(sequence)
        engine.submit(sequence)
    steps = 0
    while not all(s.finished for s in sequences):
        engine.step()
        steps += 1
        assert steps < 2_000
    backend.close()
    return sequences, steps


@pytest.fixture(scope="module")
def baseline(tiny_model_dir: Path) -> tuple[list[Sequence], int]:
    return run(tiny_model_dir, 0)


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_speculation_gives_every_sequence_exactly_its_tokens_in_fewer_steps(tiny_model_dir, baseline, k: int):
    expected, plain_steps = baseline
    got, steps = run(tiny_model_dir, k)
    for before, after in zip(expected, got, strict=True):
        assert after.error is None, after.error
        assert (after.token_ids, after.full_text, after.finish_reason) == (
            before.token_ids,
            before.full_text,
            before.finish_reason,
        ), after.request
    assert steps < plain_steps  # proposals were accepted: several tokens in some steps
