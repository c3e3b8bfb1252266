"""Logprobs on the neuronx backend (fake transformers-neuronx): prompt logprobs from a prefill
compiled with NeuronConfig(output_all_logits=True) (handler.neuronx.output_all_logits), a decode's
logits then in line order (the SDK's _postprocess skips the gather), the switch in the artifact
manifest, and the 400 naming `echo` when it is off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from handler.config import ServingConfig
from handler.errors import ConfigError
from tests.support.neuron import calls, greedy, neuronx_yaml
from tests.support.torchserve_harness import ContinuousFrontend

pytestmark = pytest.mark.usefixtures("fake_neuronx")

TOL = 1e-4
PROMPTS = ["Today the weather is", "Once upon a time there was", "The capital of France"]
COMPLETIONS = {"url_path": "v1/completions"}


def all_logits_yaml(checkpoint: Path, on: bool = True, n_slots: int = 3) -> dict:
    return neuronx_yaml(
        checkpoint, n_slots=n_slots, neuronx={"context_length_estimate": [16, 256], "output_all_logits": on}
    )


def reference(checkpoint: Path, ids: list[int]) -> torch.Tensor:
    model = AutoModelForCausalLM.from_pretrained(checkpoint, local_files_only=True, torch_dtype=torch.float32).eval()
    with torch.inference_mode():
        return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)


def test_prompt_and_generated_logprobs_are_the_models_own(checkpoint, start_backend, fake_neuronx):
    backend = start_backend(all_logits_yaml(checkpoint))
    prompts = [tuple(backend.encode(text)) for text in PROMPTS]
    requests = [greedy(slot, p, logprobs=2, prompt_logprobs=True) for slot, p in enumerate(prompts)]
    first = backend.prefill(requests)
    generated = {r.slot: [c] for r, c in zip(requests, first, strict=True)}
    for _ in range(3):  # decode in an order other than the lines', so a line-order answer is caught
        order = [2, 0, 1]
        for slot, choice in zip(order, backend.decode(order), strict=True):
            generated[slot].append(choice)
    for request, choice in zip(requests, first, strict=True):
        ids = list(request.prompt_ids) + [c.token_id for c in generated[request.slot]]
        ref = reference(checkpoint, ids)
        n = len(request.prompt_ids)
        assert [p.token_id for p in choice.prompt] == list(request.prompt_ids)
        assert choice.prompt[0].logprob is None
        for i in range(1, n):
            assert choice.prompt[i].logprob == pytest.approx(float(ref[i - 1, ids[i]]), abs=TOL)
            assert [t for t, _ in choice.prompt[i].top_logprobs] == torch.topk(ref[i - 1], 2).indices.tolist()
        for j, c in enumerate(generated[request.slot]):
            assert c.token_id == int(ref[n + j - 1].argmax())  # greedy: the model's own tokens
            assert c.logprob == pytest.approx(float(ref[n + j - 1, c.token_id]), abs=TOL)
    context = [call for call in calls(fake_neuronx, "from_pretrained")]
    assert context[-1]["neuron_config"]["output_all_logits"] is True


def test_a_one_token_prompt_with_prompt_logprobs(checkpoint, start_backend):
    backend = start_backend(all_logits_yaml(checkpoint))
    token = backend.encode("Today")[:1]
    (choice,) = backend.prefill([greedy(0, token, logprobs=0, prompt_logprobs=True)])
    ref = reference(checkpoint, [*token, choice.token_id])
    assert [(p.token_id, p.logprob) for p in choice.prompt] == [(token[0], None)]
    assert choice.token_id == int(ref[0].argmax())
    assert choice.logprob == pytest.approx(float(ref[0, choice.token_id]), abs=TOL)


def test_the_fake_returns_all_logits_as_the_sdk_does(checkpoint, monkeypatch, tmp_path):
    from transformers_neuronx import ContinuousBatchingConfig, LlamaForSampling, NeuronConfig

    monkeypatch.setenv("NEURON_COMPILE_CACHE_URL", str(tmp_path / "compile-cache"))
    model = LlamaForSampling.from_pretrained(
        str(checkpoint),
        batch_size=3,
        tp_degree=1,
        n_positions=256,
        context_length_estimate=[16, 256],
        neuron_config=NeuronConfig(
            continuous_batching=ContinuousBatchingConfig(max_num_seqs=3), output_all_logits=True
        ),
    )
    model.to_neuron()
    prompt = list(range(5, 10))
    logits = model.forward(torch.tensor([prompt]), cache_ids=torch.arange(5)[None], start_ids=torch.tensor([1]))
    assert logits.shape[:2] == (1, 5)  # [batch, T, vocab]: every position up to the last cache id
    decode = model.forward(torch.tensor([[7]]), cache_ids=torch.tensor([[5]]), start_ids=torch.tensor([1]))
    assert decode.shape[0] == 3  # every line, in line order: no gather by start_ids


def test_the_switch_is_in_the_manifest_so_a_change_recompiles(checkpoint, start_backend):
    off = start_backend(all_logits_yaml(checkpoint, on=False), warmup=False)
    assert off.path_taken == "compile" and "output_all_logits" not in off.expected["neuron_config"]
    off.close()
    again = start_backend(all_logits_yaml(checkpoint, on=False), warmup=False)
    assert again.path_taken == "load"
    again.close()
    on = start_backend(all_logits_yaml(checkpoint, on=True), warmup=False)
    assert on.path_taken == "compile" and on.expected["neuron_config"]["output_all_logits"] is True


def test_output_all_logits_in_neuron_config_points_at_the_switch(checkpoint):
    yaml = neuronx_yaml(checkpoint, neuronx={"neuron_config": {"output_all_logits": True}})
    with pytest.raises((ConfigError, ValueError), match=r"handler\.neuronx\.output_all_logits"):
        ServingConfig.from_model_yaml(yaml)


def serve(start_handler, yaml: dict, body: dict) -> tuple[int, dict]:
    handler, context = start_handler(yaml)
    (reply,) = ContinuousFrontend(handler, context, batch_size=6).serve([body], [COMPLETIONS])
    return reply.status, json.loads(reply.body)


LM_EVAL_BODY = {"model": "m", "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0, "seed": 1234}


def test_echo_with_logprobs_is_400_when_the_switch_is_off(checkpoint, start_handler):
    status, body = serve(start_handler, all_logits_yaml(checkpoint, on=False), {**LM_EVAL_BODY, "prompt": "Hi there"})
    assert status == 400
    assert body["error"]["param"] == "echo" and "handler.neuronx.output_all_logits" in body["error"]["message"]


def test_generated_logprobs_need_no_switch(checkpoint, start_handler):
    request = {"model": "m", "prompt": "Hi there", "max_tokens": 3, "logprobs": 2, "temperature": 0}
    status, body = serve(start_handler, all_logits_yaml(checkpoint, on=False), request)
    assert status == 200, body
    assert len(body["choices"][0]["logprobs"]["token_logprobs"]) == body["usage"]["completion_tokens"]


def test_lm_eval_request_with_the_switch_on(checkpoint, start_handler, tiny_tokenizer):
    ids = tiny_tokenizer("The cat sat on the mat")["input_ids"]
    status, body = serve(start_handler, all_logits_yaml(checkpoint, on=True), {**LM_EVAL_BODY, "prompt": [ids]})
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1 and lp["token_logprobs"][0] is None
    ref = reference(checkpoint, ids)
    for i in range(1, len(ids)):
        assert lp["token_logprobs"][i] == pytest.approx(float(ref[i - 1, ids[i]]), abs=TOL)
    assert lp["token_logprobs"][-1] == pytest.approx(float(ref[-1].max()), abs=TOL)
