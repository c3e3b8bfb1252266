"""Prompt-lookup speculation (issue 45) on the default model, in-process: with an answer that copies its
prompt, seeded sampled rows (temperature, top-p) and a greedy one take proposals (several tokens in a
step) and still give, token for token, what they give one token a step. The tiny model's tests
(tests/integration/test_hf_speculation.py) cover every kind of row; this one samples at the
temperatures people use, where the tiny model copies nothing."""

from __future__ import annotations

from pathlib import Path

from handler.backends.hf import HFBackend
from handler.config import HandlerConfig
from handler.engine.ngram import NgramProposer
from handler.engine.sequence import Sequence
from handler.engine.speculation import Speculator
from handler.engine.step_engine import StepEngine
from handler.request import GenerationRequest, SamplingParams
from tests.support.engine_runs import run_to_end, watching_decode_calls

PROMPT = (
    "Repeat this text exactly:\nInferentia2 is a machine learning accelerator designed by AWS. Each chip has two "
    "NeuronCores and 32 GB of high-bandwidth memory."
)
SAMPLING = (
    SamplingParams(),
    SamplingParams(do_sample=True, temperature=0.7, seed=1),
    SamplingParams(do_sample=True, temperature=1.0, top_p=0.9, seed=2),
)


def run(model_dir: Path, k: int) -> tuple[list[Sequence], list[int]]:
    """The sequences, and how many tokens each row took at most in one step."""
    backend = HFBackend(HandlerConfig(model_checkpoint_dir=str(model_dir), cpu_threads=2), model_dir, 3, k)
    engine = StepEngine(backend, 10_000, speculator=Speculator(NgramProposer(k), backoff=False) if k else None)
    text = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], tokenize=False, add_generation_prompt=True
    )
    requests = [GenerationRequest(text, 40, sampling=params) for params in SAMPLING]
    with watching_decode_calls(backend, engine) as calls:
        sequences = run_to_end(backend, requests, 200, engine)
    backend.close()
    taken = [(row.request_id, row.taken) for call in calls for row in call]
    most = [max((n for rid, n in taken if rid == s.request_id), default=0) for s in sequences]
    return sequences, most


def test_sampled_rows_speculate_and_keep_their_seeded_tokens(real_model_dir):
    plain, _ = run(real_model_dir, 0)
    speculated, most = run(real_model_dir, 3)
    for before, after in zip(plain, speculated, strict=True):
        assert after.error is None
        assert (after.token_ids, after.full_text) == (before.token_ids, before.full_text), after.request.sampling
    assert all(m > 1 for m in most), most  # every row, sampled ones included, took proposals
