"""Served logprobs equal transformers' own: the completions route with echo gives every prompt
token's logprob (what lm-eval's loglikelihood reads), and the greedy token's, each the same
checkpoint's float32 log-softmax computed in-process."""

from __future__ import annotations

import pytest

SENTENCE = "The Eiffel Tower is in Paris, and the Colosseum is in Rome. Both draw millions of visitors a year."
TOLERANCE = 1e-4


def test_echoed_prompt_and_greedy_logprobs_equal_transformers(real_server, real_client, real_tokenizer, real_model):
    import torch

    ids = real_tokenizer(SENTENCE, add_special_tokens=False).input_ids
    assert len(ids) > 10
    reply = real_client.completions.create(
        model=real_server.model_name, prompt=[ids], max_tokens=1, logprobs=1, echo=True, temperature=0
    )
    [choice] = reply.choices
    served = choice.logprobs
    print(f"echo + 1 greedy token: {choice.text!r}")
    assert len(served.token_logprobs) == len(ids) + 1  # every prompt token, then the generated one
    assert served.token_logprobs[0] is None and served.top_logprobs[0] is None
    assert choice.text.startswith(SENTENCE)
    assert "".join(served.tokens[: len(ids)]) == SENTENCE

    with torch.no_grad():
        logits = real_model(torch.tensor([ids])).logits[0].float()
    expected = torch.log_softmax(logits, dim=-1)  # row i: the distribution of token i + 1

    for i in range(1, len(ids)):
        reference = expected[i - 1, ids[i]].item()
        assert served.token_logprobs[i] == pytest.approx(reference, abs=TOLERANCE), (i, served.tokens[i])
        # the alternatives hold the most likely token at that position (and the chosen one)
        assert max(served.top_logprobs[i].values()) == pytest.approx(expected[i - 1].max().item(), abs=TOLERANCE)

    greedy = int(expected[-1].argmax())
    assert served.tokens[-1] == real_tokenizer.decode([greedy])
    assert served.token_logprobs[-1] == pytest.approx(expected[-1, greedy].item(), abs=TOLERANCE)
    largest = max(abs(served.token_logprobs[i] - expected[i - 1, ids[i]].item()) for i in range(1, len(ids)))
    print(f"largest prompt logprob difference: {largest:.2e}")
