"""EAGLE speculative decoding on the nxdi backend (issue 45), on the fake NxD Inference's fused speculation
(tests/fakes/neuronx_distributed_inference, SDK 2.28): the backend compiles the target with the EAGLE
keywords and a FusedSpecNeuronConfig for the draft, a decode step gives each row the 1 to k + 1 tokens
the device accepted, and a greedy request's text is exactly the target's greedy text without speculation.

The fake's draft proposes the target's greedy token except at positions divisible by its config's
`fake_eagle_miss_period` (models/_device.py), so rows at different positions accept different counts
in one call, and the target's picks, not the draft's, are what a row gets."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from handler.config import ServingConfig
from handler.engine.sequence import Sequence
from handler.engine.step_engine import StepEngine
from handler.errors import ConfigError
from handler.request import DecodeRow, GenerationRequest
from tests.support.engine_runs import run_to_end, watching_decode_calls
from tests.support.neuron import calls, greedy, hf_greedy, nxdi_yaml

pytestmark = pytest.mark.usefixtures("fake_neuronx", "one_torch_thread")

PROMPTS = ["Today the weather is", "Once upon a time there was", "The capital of France"]
K = 3


def make_draft(folder: Path, target: Path, miss_period: int = 3, seed: int = 0, lm_head: bool = True) -> Path:
    """An EAGLE-style draft checkpoint for the tiny model: one decoder layer, the fc layer over [embedding,
    hidden state], and the target's LM head copied in, as NxDI wants it."""
    config = json.loads((target / "config.json").read_text())
    config.update(num_hidden_layers=1, fake_eagle_miss_period=miss_period)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    generator = torch.Generator().manual_seed(seed)
    weights = {
        "fc.weight": torch.randn(hidden, 2 * hidden, generator=generator),
        "embed_tokens.weight": torch.randn(vocab, hidden, generator=generator),
        "layers.0.self_attn.q_proj.weight": torch.randn(hidden, hidden, generator=generator),
    }
    if lm_head:
        weights["lm_head.weight"] = torch.randn(vocab, hidden, generator=generator)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


def eagle_yaml(checkpoint: Path, draft: Path, k: int = K, n_slots: int = 3, **nxdi: Any) -> dict[str, Any]:
    speculation = {"method": "eagle", "draft_model_path": str(draft), "num_speculative_tokens": k}
    settings = {"context_buckets": [16, 64], "on_device_sampling": True, "speculation": speculation, **nxdi}
    return nxdi_yaml(checkpoint, n_slots=n_slots, nxdi=settings)


@pytest.fixture
def draft(tmp_path: Path, checkpoint: Path) -> Path:
    return make_draft(tmp_path / "draft", checkpoint)


@pytest.fixture
def start(checkpoint: Path, draft: Path) -> Iterator[Callable[..., Any]]:
    """start(model_yaml=None, draft=None) -> a warmed NxdiBackend (default: eagle_yaml with k=3)."""
    from handler.backends.nxdi import NxdiBackend

    started: list[Any] = []

    def run(model_yaml: dict[str, Any] | None = None, draft_dir: Path | None = None) -> Any:
        config = ServingConfig.from_model_yaml(model_yaml or eagle_yaml(checkpoint, draft))
        backend = NxdiBackend(config, checkpoint, None, 1, draft=draft_dir)
        started.append(backend)
        backend.warmup()
        return backend

    yield run
    for backend in started:
        backend.close()


def serve(backend: Any, requests: list[GenerationRequest], steps: int = 200) -> tuple[list[Sequence], list[Any]]:
    """The requests through a StepEngine to their ends; the sequences and, per decode call, each row's
    (slot, max_tokens, tokens taken)."""
    engine = StepEngine(backend, prefill_token_budget=4096)
    with watching_decode_calls(backend, engine) as calls:
        sequences = run_to_end(backend, requests, steps, engine)
    return sequences, [[(r.slot, r.max_tokens, r.taken) for r in call] for call in calls]


def test_the_target_is_compiled_with_the_eagle_keywords_and_the_draft_fused_in(start, draft, fake_neuronx):
    backend = start()
    saved = json.loads((backend.cache.artifacts_dir / "neuron_config.json").read_text())
    target = saved["neuron_config"]
    assert target["speculation_length"] == K + 1  # the draft runs speculation_length - 1 times: k drafts
    assert target["enable_fused_speculation"] is True and target["enable_eagle_speculation"] is True
    assert target["is_eagle_draft"] is False and target["on_device_sampling_config"]["dynamic"] is True
    assert "trace_tokengen_model" not in target  # derived by NxDI 0.8, not a keyword
    fused = saved["fused_spec_config"]
    assert fused["draft_model_path"] == str(draft)
    llama = "neuronx_distributed_inference.models.llama.modeling_llama"
    assert fused["worker_cls"] == {"__module__": llama, "__name__": "NeuronLlamaModel"}  # the target's _model_cls
    draft_config = fused["draft_config"]["neuron_config"]
    assert draft_config["is_eagle_draft"] is True and draft_config["enable_fused_speculation"] is False
    assert draft_config["speculation_length"] == K + 1 and draft_config["enable_eagle_speculation"] is True
    assert fused["draft_config"]["num_hidden_layers"] == 1  # the draft's own config.json
    [compiled] = calls(fake_neuronx, "compile")
    assert set(compiled["buckets"]) == {"context_encoding_model", "fused_speculation_model"}
    # the draft's weights went with the target's into what NxD sharded, and the device holds them
    [load] = calls(fake_neuronx, "load")
    assert load["draft"] and load["weights"] == "presharded"
    manifest = json.loads((backend.cache.artifacts_dir / "manifest.json").read_text())
    speculation = manifest["depends_on"]["speculation"]
    assert speculation["method"] == "eagle" and speculation["num_speculative_tokens"] == K
    assert set(speculation["draft"]["weights"]) == {"model.safetensors"}
    assert backend.tokens_per_step == K + 1 and backend.draft_tokens == K
    # the last k - 1 of the 256 compiled positions are the look-ahead of the last decode
    assert backend.n_positions == 256 - (K - 1) and target["seq_len"] == 256


def test_one_step_gives_rows_different_counts_up_to_k_plus_1(start, fake_neuronx):
    backend = start()
    prompts = [backend.encode(p) for p in PROMPTS]
    backend.prefill([greedy(slot, prompt) for slot, prompt in enumerate(prompts)])
    before = len(calls(fake_neuronx, "forward"))
    counts: list[list[int]] = []
    for _ in range(4):
        answer = backend.decode_plan([DecodeRow(slot, max_tokens=K + 1) for slot in range(3)])
        counts.append([len(tokens) for tokens in answer])
    decodes = calls(fake_neuronx, "forward")[before:]
    assert [[len(row) for row in f["accepted"]] for f in decodes] == counts
    assert all(1 <= c <= K + 1 for step in counts for c in step)
    assert any(len(set(step)) > 1 for step in counts), counts  # one call, different counts
    assert all(f["programs"][0]["tag"] == "fused_speculation_model" for f in decodes)


def test_a_never_missing_draft_gives_every_row_k_plus_1_tokens_a_step(start, checkpoint, tmp_path, fake_neuronx):
    perfect = make_draft(tmp_path / "perfect", checkpoint, miss_period=0)
    backend = start(eagle_yaml(checkpoint, perfect))
    backend.prefill([greedy(0, backend.encode(PROMPTS[0])), greedy(1, backend.encode(PROMPTS[1]))])
    answer = backend.decode_plan([DecodeRow(0, max_tokens=K + 1), DecodeRow(1, max_tokens=2)])
    assert [len(tokens) for tokens in answer] == [K + 1, 2]  # the second cut at its max_tokens
    accepted = calls(fake_neuronx, "forward")[-1]["accepted"]
    assert [len(row) for row in accepted] == [K + 1, K + 1]
    assert [[t.token_id for t in tokens] for tokens in answer] == [accepted[0], accepted[1][:2]]


@pytest.mark.parametrize("miss_period", [3, 2, 0])
def test_served_text_is_the_targets_greedy_text_through_the_engine(start, checkpoint, tmp_path, miss_period):
    drafted = make_draft(tmp_path / f"d{miss_period}", checkpoint, miss_period=miss_period)
    backend = start(eagle_yaml(checkpoint, drafted))
    requests = [GenerationRequest(prompt, 12, ignore_eos=True) for prompt in PROMPTS]
    requests.append(GenerationRequest(PROMPTS[0], 5, ignore_eos=True))  # waits for a slot, then joins mid-way
    sequences, plans = serve(backend, requests)
    for request, sequence in zip(requests, sequences, strict=True):
        assert sequence.token_ids == hf_greedy(checkpoint, backend.encode(request.prompt), request.max_new_tokens)
    assert all(taken <= most <= K + 1 for plan in plans for _, most, taken in plan)
    taken = [t for plan in plans for _, _, t in plan]
    if miss_period == 0:
        assert max(taken) == K + 1
    else:  # rows of one step took different counts
        assert any(len({t for _, most, t in plan if most == K + 1}) > 1 for plan in plans), plans
    assert len(plans) < sum(r.max_new_tokens for r in requests[:3]) // 3  # fewer steps than tokens


def test_max_tokens_cuts_a_step_and_the_row_goes_on_exactly(start, checkpoint, tmp_path):
    perfect = make_draft(tmp_path / "perfect", checkpoint, miss_period=0)
    backend = start(eagle_yaml(checkpoint, perfect))
    prompt = backend.encode(PROMPTS[1])
    backend.prefill([greedy(0, prompt)])
    tokens = [backend._live[0].token]
    for most in (2, 1, K + 1, 3):  # cut below what the device accepted (all k + 1)
        [got] = backend.decode_plan([DecodeRow(0, max_tokens=most)])
        assert len(got) == most
        tokens += [choice.token_id for choice in got]
    assert tokens == hf_greedy(checkpoint, prompt, len(tokens))
    backend.release(0)
    # through the engine: a request of 6 tokens gets 1 (prefill) + 4 + 1, its last row cut to 1
    [sequence], plans = serve(backend, [GenerationRequest(PROMPTS[1], 6, ignore_eos=True)])
    assert [most for plan in plans for _, most, _ in plan] == [K + 1, 1]
    assert sequence.token_ids == hf_greedy(checkpoint, prompt, 6)


def test_sampled_rows_are_served_beside_greedy_ones(start, checkpoint):
    from handler.request import SamplingParams

    backend = start()
    sampled = SamplingParams(do_sample=True, temperature=0.7, top_k=20)
    requests = [
        GenerationRequest(PROMPTS[0], 10, ignore_eos=True),
        GenerationRequest(PROMPTS[1], 10, sampling=sampled, ignore_eos=True),
    ]
    sequences, _ = serve(backend, requests)
    assert sequences[0].token_ids == hf_greedy(checkpoint, backend.encode(PROMPTS[0]), 10)
    assert sequences[1].completion_tokens == 10


def test_a_changed_draft_recompiles_and_is_never_served_stale(start, checkpoint, draft, fake_neuronx):
    start().close()
    again = start()
    assert again.path_taken == "load"  # unchanged
    again.close()
    first = calls(fake_neuronx, "load")[0]["draft"]
    make_draft(draft, checkpoint, seed=5)  # new weights, same shapes and sizes
    changed = start()
    assert changed.path_taken == "compile" and len(calls(fake_neuronx, "compile")) == 2
    assert calls(fake_neuronx, "load")[-1]["draft"] != first  # the device holds the new draft
    changed.close()
    make_draft(draft, checkpoint, seed=6)
    stale = r"manifest mismatch \(speculation\.draft\.weights\.model\.safetensors\.sha256: '[0-9a-f]+' -> "
    with pytest.raises(ConfigError, match=stale):
        start(eagle_yaml(checkpoint, draft, compile_on_start=False))


@pytest.mark.compile_in_child  # the recipe, the draft's folder included, goes to the compile child as JSON
def test_a_moved_draft_with_the_same_content_loads_and_is_read_from_its_new_folder(
    start, checkpoint, draft, tmp_path, fake_neuronx
):
    unsharded = {"save_sharded_checkpoint": False}
    start(eagle_yaml(checkpoint, draft, **unsharded)).close()
    moved = tmp_path / "elsewhere" / "draft"
    shutil.move(draft, moved)
    backend = start(eagle_yaml(checkpoint, moved, compile_on_start=False, **unsharded))
    assert backend.path_taken == "load"
    assert json.loads((backend.cache.artifacts_dir / "neuron_config.json").read_text())["fused_spec_config"][
        "draft_model_path"
    ] == str(draft)  # what was compiled; the load read the draft from where it is now
    assert calls(fake_neuronx, "load")[-1]["weights"] == "resharded"


def test_a_relative_draft_is_found_in_the_archive_by_the_loader(checkpoint, draft, fake_neuronx):
    from handler.backends.loader import load_backend

    archive = checkpoint.parent
    yaml = eagle_yaml(checkpoint, Path(draft.name))
    backend = load_backend(ServingConfig.from_model_yaml(yaml), archive)
    try:
        assert backend.draft_dir == archive / draft.name and backend.draft_tokens == K
    finally:
        backend.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"on_device_sampling": False}, r"handler\.nxdi: .*speculation needs on_device_sampling: true"),
        ({"neuron_config": {"token_generation_batches": [1, 2]}}, r"neuron_config\.token_generation_batches"),
        ({"neuron_config": {"speculation_length": 4}}, r"neuron_config\.speculation_length: refused"),
        ({"neuron_config": {"trace_tokengen_model": False}}, r"neuron_config\.trace_tokengen_model: refused"),
        ({"neuron_config": {"is_eagle_draft": True}}, r"neuron_config\.is_eagle_draft: refused"),
        ({"speculation": {"method": "medusa", "draft_model_path": "d", "num_speculative_tokens": 2}}, r"method"),
        ({"speculation": {"method": "eagle", "draft_model_path": "d", "num_speculative_tokens": 0}}, r"num_spec"),
        ({"speculation": {"method": "eagle", "draft_model_path": "d", "num_speculative_tokens": 9}}, r"num_spec"),
        ({"speculation": {"method": "eagle", "num_speculative_tokens": 2}}, r"draft_model_path: required"),
    ],
)
def test_configurations_nxdi_cannot_serve_are_refused_naming_the_field(checkpoint, draft, change, message):
    yaml = eagle_yaml(checkpoint, draft)
    yaml["handler"]["nxdi"].update(change)
    with pytest.raises(ConfigError, match=message):
        ServingConfig.from_model_yaml(yaml)


def test_static_mode_lora_other_backends_and_a_short_n_positions_are_refused(checkpoint, draft):
    static = eagle_yaml(checkpoint, draft)
    static.update(continuousBatching=False, scheduler={"mode": "static", "n_slots": 2}, batchSize=2)
    with pytest.raises(ConfigError, match=r"handler\.nxdi\.speculation needs scheduler\.mode continuous"):
        ServingConfig.from_model_yaml(static)
    lora = eagle_yaml(checkpoint, draft)
    lora["handler"]["lora"] = {"adapters": {"a": "adapters/a"}}
    with pytest.raises(ConfigError, match=r"handler\.nxdi\.speculation cannot go with handler\.lora"):
        ServingConfig.from_model_yaml(lora)
    other = eagle_yaml(checkpoint, draft)
    other["handler"]["backend"] = "neuronx"
    with pytest.raises(ConfigError, match=r"handler\.nxdi\.speculation: only backend nxdi reads it"):
        ServingConfig.from_model_yaml(other)
    long = eagle_yaml(checkpoint, draft, k=8)
    long["handler"].update(n_positions=64, max_new_tokens=60, default_max_new_tokens=8)
    with pytest.raises(ConfigError, match=r"num_speculative_tokens: 8 drafted tokens keep the last 7"):
        ServingConfig.from_model_yaml(long)


def test_prompt_lookup_on_nxdi_still_points_at_eagle(checkpoint, draft):
    yaml = eagle_yaml(checkpoint, draft)
    yaml["scheduler"]["speculation"] = {"method": "ngram", "num_speculative_tokens": 2}
    with pytest.raises(ConfigError, match=r"scheduler\.speculation: backend nxdi .* set handler\.nxdi\.speculation"):
        ServingConfig.from_model_yaml(yaml)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root, ckpt: make_draft(root / "d", ckpt, lm_head=False), r"has no lm_head\.weight"),
        (lambda root, ckpt: root / "missing", r"is not a directory"),
        (lambda root, ckpt: _resized(make_draft(root / "d", ckpt)), r"the draft's vocab_size \(99\) is not the model"),
    ],
)
def test_a_draft_nxdi_cannot_use_is_refused_at_start_before_any_compile(
    start, checkpoint, tmp_path, fake_neuronx, make, message
):
    bad = make(tmp_path, checkpoint)
    with pytest.raises(ConfigError, match=rf"handler\.nxdi\.speculation\.draft_model_path: .*{message}"):
        start(eagle_yaml(checkpoint, bad))
    assert not calls(fake_neuronx, "compile")


def _resized(draft: Path) -> Path:
    config = json.loads((draft / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "vocab_size": 99}))
    return draft


def test_the_fake_refuses_what_nxdi_refuses(checkpoint, draft):
    """NxDI's own refusals, as the fake raises them: fused speculation without on-device sampling (a bare
    assert in every fused forward, at trace time) and without a fused_spec_config (construction)."""
    from handler.backends.nxdi import ModelRecipe, Sdk

    sdk = Sdk.load("llama.modeling_llama.NeuronLlamaForCausalLM")
    keywords = {
        "tp_degree": 1,
        "batch_size": 2,
        "ctx_batch_size": 1,
        "is_continuous_batching": True,
        "seq_len": 64,
        "enable_bucketing": True,
        "context_encoding_buckets": [16, 64],
        "token_generation_buckets": [64],
        "max_context_length": 64,
        "torch_dtype": "float32",
        "speculation_length": 3,
        "enable_eagle_speculation": True,
    }
    host = ModelRecipe(str(checkpoint), "llama.modeling_llama.NeuronLlamaForCausalLM", keywords, None, None, str(draft))
    with pytest.raises(AssertionError):
        sdk.build(host).compile(str(checkpoint.parent / "out"))
    bare = ModelRecipe(str(checkpoint), host.model_class, keywords, {"dynamic": True, "do_sample": True})
    with pytest.raises(AttributeError, match="draft_config"):
        sdk.build(bare)
    assert sdk.neuron_config(bare).enable_fused_speculation is True  # enable_eagle_speculation turns it on
    with pytest.raises(ValueError, match=r"Batch bucketing .* fused speculation"):
        sdk.neuron_config(ModelRecipe(str(checkpoint), host.model_class, {**keywords, "token_generation_batches": 2}))


def test_the_fake_takes_trace_tokengen_model_as_nxdi_0_8_does(caplog):
    """Not a keyword any more (logged as unexpected, ignored); reading the attribute warns and derives it."""
    from neuronx_distributed_inference.models.config import NeuronConfig

    config = NeuronConfig(speculation_length=4, enable_eagle_speculation=True, trace_tokengen_model=False)
    assert "Unexpected keyword arguments: {'trace_tokengen_model': False}" in caplog.text
    with pytest.warns(DeprecationWarning, match="trace_tokengen_model"):
        assert config.trace_tokengen_model is True  # the real expression: True unless Medusa is on too
