"""The host sampler: every row's next token of a step from its logits, in one vectorized pass
(vLLM keeps its sampler in `v1/sample/`). The backends that sample on the host (hf, neuronx, nxdi
with host sampling, sim on its stand-in logits) call it; it knows the domain types
(`handler/request.py`) and the grammar masks (`handler/grammar/`), never a backend, the engine,
the config or the wire.

- `sampler.py`: `BatchSampler`, one per backend: per-slot state, the repetition penalty, greedy
  and sampled rows, logprobs;
- `choice.py`: the token choice itself (argmax, top-k, top-p, the inverse-CDF pick), stateless;
- `shaping.py`: `OutputShaper`, what a request asks of its output beyond the choice (presence /
  frequency penalties, logit_bias, EOS suppression, min_tokens, grammar masks);
- `logprobs.py`: a position's alternatives and a prompt's own logprobs.
"""
