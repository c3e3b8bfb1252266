"""The neuronx encoder (handler/backends/encoder_neuron.py) on the fake torch_neuronx: one traced module
per bucket, each call exactly a bucket's shape, vectors equal to the hf encoder's, the artifacts'
manifest deciding load or trace."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from handler.backends.loader import load_encoder
from handler.config import ServingConfig
from handler.errors import ConfigError
from tests.support.neuron import calls

pytestmark = pytest.mark.usefixtures("fake_neuronx")
BUCKETS = {"batch_sizes": [1, 4], "seq_lengths": [16, 64]}


@pytest.fixture
def encoder_checkpoint(tiny_encoder_dir: Path, tmp_path: Path) -> Path:
    """A private copy: the artifacts are written next to the checkpoint."""
    return Path(shutil.copytree(tiny_encoder_dir, tmp_path / "encoder"))


def embed_yaml(checkpoint: Path, backend: str = "neuronx", **handler: Any) -> dict[str, Any]:
    embed = {"buckets": BUCKETS, **handler.pop("embed", {})}
    neuronx = {"num_cores": 2, **handler.pop("neuronx", {})}
    return {
        "batchSize": 8,
        "maxBatchDelay": 5,
        "jobQueueSize": 16,
        "handler": {
            "task": "embed",
            "model_checkpoint_dir": str(checkpoint),
            "backend": backend,
            "embed": embed,
            **({"neuronx": neuronx} if backend != "hf" else {}),
            **handler,
        },
    }


def start(checkpoint: Path, backend: str = "neuronx", **handler: Any):
    return load_encoder(ServingConfig.from_model_yaml(embed_yaml(checkpoint, backend, **handler)), None)


def rows_of(encoder, texts: list[str]) -> list[list[int]]:
    return [encoder.tokenize(text) for text in texts]


TEXTS = [
    "hello",
    "the quick brown fox jumps over the lazy dog",
    "a",
    " ".join(["word"] * 30),
    "embeddings for retrieval",
    "another short one",
    " ".join(["longer input text"] * 5),
    "six",
    "seven is here",
    "eight",
    "nine nine nine",
]


def test_vectors_equal_the_hf_encoders_and_every_call_is_a_traced_bucket(encoder_checkpoint, fake_neuronx):
    hf = start(encoder_checkpoint, "hf")
    neuron = start(encoder_checkpoint)
    try:
        rows = rows_of(hf, TEXTS)
        assert rows == rows_of(neuron, TEXTS)
        assert {len(r) <= 16 for r in rows} == {True, False}  # both sequence buckets are used
        expected, got = hf.encode(rows), neuron.encode(rows)
        assert got.shape == expected.shape == (len(rows), hf.dimension)
        cosine = torch.nn.functional.cosine_similarity(got, expected, dim=1)
        assert float(cosine.min()) >= 0.9999, cosine
        assert torch.allclose(got.norm(dim=1), torch.ones(len(rows)), atol=1e-4)  # normalised in the graph

        traced = {tuple(c["shapes"]) for c in calls(fake_neuronx, "trace")}
        forwards = [tuple(c["shapes"]) for c in calls(fake_neuronx, "forward")]
        assert len(traced) == 4 and set(forwards) <= traced
        assert not calls(fake_neuronx, "forward_refused")
    finally:
        hf.close()
        neuron.close()


def test_rows_are_padded_to_the_smallest_bucket_and_split_above_the_largest(encoder_checkpoint):
    encoder = start(encoder_checkpoint)
    try:
        rows = [[5] * 3] * 6 + [[5] * 20] * 2 + [[5] * 16]
        plan = encoder.plan(rows)
        assert plan == [((4, 16), [0, 1, 2, 3]), ((4, 16), [4, 5, 8]), ((4, 64), [6, 7])]
        assert encoder.plan([[5] * 64]) == [((1, 64), [0])]
        single = encoder.encode([rows[6]])
        assert torch.allclose(encoder.encode(rows)[6], single[0], atol=1e-5)  # filler rows change nothing
    finally:
        encoder.close()


def test_a_traced_module_refuses_any_other_shape(encoder_checkpoint, fake_neuronx):
    encoder = start(encoder_checkpoint)
    try:
        module = encoder.model[(4, 16)]
        ids, mask = encoder.padded([[5] * 3], 16, 4)
        assert module(ids, mask).shape == (4, encoder.dimension)
        for bad in (encoder.padded([[5] * 3], 16, 3), encoder.padded([[5] * 3], 17, 4), (ids.int(), mask)):
            with pytest.raises(RuntimeError, match="TorchScript interpreter"):
                module(*bad)
        assert len(calls(fake_neuronx, "forward_refused")) == 3
    finally:
        encoder.close()


def test_a_row_longer_than_the_largest_bucket_is_refused(encoder_checkpoint):
    encoder = start(encoder_checkpoint, embed={"buckets": {"batch_sizes": [2], "seq_lengths": [8, 32]}})
    try:
        assert encoder.max_length == 32
        assert encoder.encode([[5] * 32]).shape == (1, encoder.dimension)
        with pytest.raises(ValueError, match=r"1\.\.32 token ids"):
            encoder.encode([[5] * 33])
        with pytest.raises(ValueError, match=r"1\.\.32"):
            encoder.encode([[]])
    finally:
        encoder.close()


def test_a_bucket_above_the_models_longest_input_fails_the_start(encoder_checkpoint, fake_neuronx):
    with pytest.raises(ConfigError, match=r"seq_lengths: 128 is above the model's longest input \(64"):
        start(encoder_checkpoint, embed={"buckets": {"batch_sizes": [1], "seq_lengths": [128]}})


def test_default_sequence_buckets_end_at_the_models_longest_input(encoder_checkpoint):
    encoder = start(encoder_checkpoint, embed={"buckets": {"batch_sizes": [1]}})
    try:
        assert encoder.seq_buckets == [64] and encoder.max_length == 64
    finally:
        encoder.close()


def test_fresh_artifacts_load_without_tracing_and_stale_ones_recompile(encoder_checkpoint, fake_neuronx):
    first = start(encoder_checkpoint)
    vectors = first.encode([[2, 7, 9, 3]])
    first.close()
    manifest = json.loads((encoder_checkpoint / "neuron_cache" / "artifacts" / "manifest.json").read_text())
    assert manifest["depends_on"]["buckets"] == BUCKETS and manifest["depends_on"]["task"] == "embed"
    assert first.path_taken == "compile" and len(calls(fake_neuronx, "trace")) == 4

    again = start(encoder_checkpoint)
    try:
        assert again.path_taken == "load" and len(calls(fake_neuronx, "trace")) == 4  # no trace
        assert torch.allclose(again.encode([[2, 7, 9, 3]]), vectors)
    finally:
        again.close()

    other_buckets = {"buckets": {"batch_sizes": [2], "seq_lengths": [64]}}
    changed = start(encoder_checkpoint, embed=other_buckets)
    changed.close()
    assert changed.path_taken == "compile" and len(calls(fake_neuronx, "trace")) == 5

    weights = encoder_checkpoint / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # same size, other content: the traced modules hold the old weights inline
    weights.write_bytes(bytes(data))
    retraced = start(encoder_checkpoint, embed=other_buckets)
    retraced.close()
    assert retraced.path_taken == "compile" and len(calls(fake_neuronx, "trace")) == 6


def test_stale_artifacts_are_refused_when_compiling_is_off(encoder_checkpoint):
    start(encoder_checkpoint).close()
    with pytest.raises(ConfigError, match=r"manifest mismatch \(buckets.batch_sizes"):
        start(
            encoder_checkpoint,
            embed={"buckets": {"batch_sizes": [1, 2], "seq_lengths": [16, 64]}},
            neuronx={"compile_on_start": False},
        )


def test_each_worker_takes_one_neuron_core(encoder_checkpoint):
    import os

    first, second = start(encoder_checkpoint), start(encoder_checkpoint)
    try:
        assert (first.placement.cores, second.placement.cores) == ((0,), (1,))
        assert os.environ["NEURON_RT_VISIBLE_CORES"] == "1"  # the last one started pinned this process
        with pytest.raises(ConfigError, match="held by other processes"):
            start(encoder_checkpoint)
    finally:
        first.close()
        second.close()


def test_the_embedding_archive_serves_neuronx_through_the_handler(encoder_checkpoint, tiny_encoder_dir):
    """The TorchServe adapter on the neuronx encoder: the same vectors as plain transformers, and an
    input longer than the largest sequence bucket is a 400 naming it."""
    from transformers import AutoModel, AutoTokenizer

    from handler.inf2_handler import Inf2StreamingHandler
    from tests.support.torchserve_harness import make_context, run_batch

    texts = ["The weather is nice today.", "a cat", " ".join(["rain"] * 20)]
    raw = embed_yaml(encoder_checkpoint, embed={"buckets": {"batch_sizes": [1, 2], "seq_lengths": [8, 16]}})
    handler = Inf2StreamingHandler()
    context = make_context(raw, str(encoder_checkpoint))
    handler.initialize(context)
    try:
        assert handler.serving.encoder.name == "neuronx"
        good, too_long = run_batch(
            handler,
            context,
            [{"input": texts[:2], "model": "m"}, {"input": ["ok", texts[2]]}],
            [{"url_path": "v1/embeddings"}] * 2,
        )
    finally:
        handler.shutdown()
    assert good.status == 200, good.final
    tokenizer = AutoTokenizer.from_pretrained(tiny_encoder_dir, local_files_only=True)
    model = AutoModel.from_pretrained(tiny_encoder_dir, local_files_only=True).eval()
    for text, item in zip(texts, json.loads(good.final)["data"], strict=False):
        with torch.inference_mode():
            hidden = model(**tokenizer(text, return_tensors="pt")).last_hidden_state
        expected = torch.nn.functional.normalize(hidden.mean(dim=1), dim=1)[0]
        assert float(torch.nn.functional.cosine_similarity(torch.tensor(item["embedding"]), expected, dim=0)) >= 0.9999
    assert too_long.status == 400 and json.loads(too_long.final)["error"]["param"] == "input[1]"
