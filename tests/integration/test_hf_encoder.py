"""The hf encoder (handler/backends/encoder.py) on tiny sentence-transformers checkpoints built by
scripts/model/make_tiny_encoder.py: a padded batch gives each row's own vector, the checkpoint's
pooling config is what runs, lengths are bounded by the checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from handler.backends.encoder import HFEncoder
from handler.config import HandlerConfig

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["a cat", "The weather is nice today, and tomorrow it may rain over the hills.", "sun"]


def encoder_for(checkpoint: Path) -> HFEncoder:
    return HFEncoder(HandlerConfig(model_checkpoint_dir=str(checkpoint)), checkpoint)


@pytest.fixture(scope="module")
def cls_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second layout: CLS pooling, no Normalize module, max_seq_length 16."""
    out = tmp_path_factory.mktemp("tiny-cls-encoder")
    command = [sys.executable, "-m", "scripts.model.make_tiny_encoder", str(out), "--pooling", "cls"]
    subprocess.run([*command, "--max-seq-length", "16", "--seed", "1"], check=True, cwd=REPO)
    return out


def test_a_padded_batch_gives_each_row_its_own_vector(tiny_encoder_dir):
    encoder = encoder_for(tiny_encoder_dir)
    rows = [encoder.tokenize(t) for t in TEXTS]
    assert len({len(r) for r in rows}) == 3  # really padded
    together = encoder.encode(rows)
    assert together.shape == (3, encoder.dimension) and together.dtype == torch.float32
    for row, vector in zip(rows, together, strict=True):
        assert torch.allclose(encoder.encode([row])[0], vector, atol=1e-5)
    assert torch.allclose(together.norm(dim=1), torch.ones(3), atol=1e-5)  # the Normalize module


def test_the_checkpoints_pooling_config_is_what_runs(cls_encoder_dir):
    encoder = encoder_for(cls_encoder_dir)
    assert (encoder.sentence.pooling, encoder.sentence.normalize, encoder.max_length) == ("cls", False, 16)
    tokenizer = AutoTokenizer.from_pretrained(cls_encoder_dir, local_files_only=True)
    model = AutoModel.from_pretrained(cls_encoder_dir, local_files_only=True).eval()
    served = encoder.encode([encoder.tokenize(t) for t in TEXTS[::2]])
    for text, vector in zip(TEXTS[::2], served, strict=True):
        with torch.inference_mode():
            first = model(**tokenizer(text, return_tensors="pt")).last_hidden_state[0, 0]
        assert torch.allclose(vector, first, atol=1e-5)
    assert not torch.allclose(served.norm(dim=1), torch.ones(2), atol=1e-2)  # no normalisation


def test_lengths_are_bounded_by_the_checkpoint(tiny_encoder_dir):
    encoder = encoder_for(tiny_encoder_dir)
    assert encoder.max_length == 64  # max_seq_length, below the tokenizer's 128 and the 128 positions
    assert len(encoder.tokenize(" ".join(["weather"] * 100))) > 64  # never truncated by tokenize
    for rows in ([[2] * 65], [[2, 3], []]):
        with pytest.raises(ValueError, match=r"1\.\.64 token ids"):
            encoder.encode(rows)
    assert encoder.encode([]).shape == (0, encoder.dimension)


def test_a_tokenizer_json_with_built_in_truncation_and_padding_cuts_nothing(tiny_encoder_dir, tmp_path):
    """As all-MiniLM-L6-v2's shipped tokenizer.json (truncation and fixed padding to 128)."""
    import json
    import shutil

    checkpoint = tmp_path / "encoder"
    shutil.copytree(tiny_encoder_dir, checkpoint)
    path = checkpoint / "tokenizer.json"
    data = json.loads(path.read_text())
    data["truncation"] = {"direction": "Right", "max_length": 8, "strategy": "LongestFirst", "stride": 0}
    data["padding"] = {
        "strategy": {"Fixed": 8},
        "direction": "Right",
        "pad_to_multiple_of": None,
        "pad_id": 0,
        "pad_type_id": 0,
        "pad_token": "[PAD]",
    }
    path.write_text(json.dumps(data))
    encoder, plain = encoder_for(checkpoint), encoder_for(tiny_encoder_dir)
    encoder.warmup()
    assert encoder.tokenize(TEXTS[1]) == plain.tokenize(TEXTS[1]) and len(plain.tokenize(TEXTS[1])) > 8
    assert encoder.tokenize("sun") == plain.tokenize("sun")  # not padded to 8 either
