"""Structured output and the sampling fields on the device backends (neuronx and nxdi with host
sampling, against the fake SDKs): the shared BatchSampler masks the device's logits, a
constrained request and its unconstrained batch-mate each get what they get alone."""

from __future__ import annotations

import re

import pytest

from handler.engine.sequence import FinishReason
from handler.request import Constraint, GenerationRequest, SamplingParams
from tests.support.engine_runs import run_to_end
from tests.support.neuron import neuronx_yaml, nxdi_yaml

DIGITS = Constraint("regex", "[0-9]{3}-[0-9]{2}")


@pytest.fixture(params=["neuronx", "nxdi"])
def backend(request, fake_neuronx, checkpoint, start_backend):
    if request.param == "nxdi":
        return start_backend(nxdi_yaml(checkpoint, n_slots=3, nxdi={"context_buckets": [16, 256]}))
    return start_backend(neuronx_yaml(checkpoint, n_slots=3, neuronx={"context_length_estimate": [16, 256]}))


def test_grammar_bias_and_penalties_on_device_logits(backend):
    """One backend start per SDK (each costs a fake compile): a constrained request beside a free
    one, each as it is alone; then logit_bias and the penalties on the same backend."""
    constrained = GenerationRequest("Today the weather is", 20, constraint=DIGITS)
    sampled = GenerationRequest(
        "Once upon a time", 20, SamplingParams(do_sample=True, seed=5, temperature=0.9), constraint=DIGITS
    )
    free = GenerationRequest("The capital of France", 8, ignore_eos=True)
    together = run_to_end(backend, [constrained, sampled, free])
    for sequence in together[:2]:
        assert re.fullmatch(r"[0-9]{3}-[0-9]{2}", sequence.full_text), sequence.full_text
        assert sequence.finish_reason is FinishReason.EOS  # the grammar ended it (finish_reason "stop")
    alone = [run_to_end(backend, [r])[0].token_ids for r in (constrained, sampled, free)]
    assert [s.token_ids for s in together] == alone

    (greedy,) = run_to_end(backend, [GenerationRequest("Today the weather is", 6, ignore_eos=True)])
    favourite = greedy.token_ids[0]
    banned = GenerationRequest(
        "Today the weather is", 6, SamplingParams(logit_bias=((favourite, -100.0),)), ignore_eos=True
    )
    penalized = GenerationRequest(
        "Today the weather is", 6, SamplingParams(frequency_penalty=2.0, presence_penalty=2.0), ignore_eos=True
    )
    banned_out, penalized_out = run_to_end(backend, [banned, penalized])
    assert favourite not in banned_out.token_ids
    assert len(set(penalized_out.token_ids)) >= len(set(greedy.token_ids))
    assert penalized_out.token_ids != greedy.token_ids or len(set(greedy.token_ids)) == 6
