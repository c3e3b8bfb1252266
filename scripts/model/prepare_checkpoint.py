"""Turn a local Hugging Face model folder into the checkpoint the neuronx backend loads.

Current transformers-neuronx reads plain Hugging Face safetensors (`model.safetensors` or
its sharded index) directly, so the default just copies those files (and the config and
tokenizer) into the target folder, converting a `.bin`-only checkpoint to safetensors.
`--format split` writes the `pytorch_model.bin/` folder of one file per tensor that
transformers-neuronx's `save_pretrained_split` produces, for older releases; it needs
transformers-neuronx installed (an inf2 host).

    python -m scripts.model.prepare_checkpoint /models/Llama-2-7b-hf models/llama-2-7b
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tqdm import tqdm

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")


def metadata_files(source: Path) -> list[Path]:
    """config, generation config, tokenizer: everything that is not a weights file."""
    return sorted(
        p
        for p in source.iterdir()
        if p.is_file() and not p.name.endswith(WEIGHT_SUFFIXES) and not p.name.endswith(".index.json")
    )


def weight_files(source: Path) -> list[Path]:
    return sorted(p for p in source.iterdir() if p.is_file() and p.name.endswith(".safetensors")) + [
        p for p in source.glob("model.safetensors.index.json")
    ]


def copy_with_progress(files: Sequence[Path], target: Path) -> None:
    total = sum(f.stat().st_size for f in files)
    with tqdm(total=total, unit="B", unit_scale=True, desc="copying checkpoint") as bar:
        for src in files:
            with open(src, "rb") as fin, open(target / src.name, "wb") as fout:
                while block := fin.read(16 << 20):
                    fout.write(block)
                    bar.update(len(block))
            shutil.copystat(src, target / src.name)


def load_model(source: Path):
    import transformers

    # `torch_dtype` became `dtype` in transformers 4.56; Neuron venvs have 4.4x
    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    dtype_key = "dtype" if (major, minor) >= (4, 56) else "torch_dtype"
    return transformers.AutoModelForCausalLM.from_pretrained(source, local_files_only=True, **{dtype_key: "auto"})


def prepare(source: Path, target: Path, fmt: str) -> str:
    if not (source / "config.json").is_file():
        raise SystemExit(f"{source} is not a Hugging Face checkpoint (no config.json)")
    has_safetensors = any((source / name).exists() for name in SAFETENSORS)
    same = source.resolve() == target.resolve()
    target.mkdir(parents=True, exist_ok=True)
    if not same:
        copy_with_progress(metadata_files(source), target)
    if fmt == "split":
        try:
            from transformers_neuronx.module import save_pretrained_split
        except ImportError:
            raise SystemExit(
                "--format split needs transformers-neuronx (pip install -r requirements-neuron.txt on an inf2 host); "
                "current releases read safetensors directly: use --format safetensors"
            ) from None
        with tqdm(total=2, desc="split checkpoint") as bar:
            model = load_model(source)
            bar.update()
            save_pretrained_split(model, target)
            bar.update()
        return f"{target}/pytorch_model.bin/ (split, for older transformers-neuronx)"
    if has_safetensors:
        if not same:
            copy_with_progress(weight_files(source), target)
        return f"{target} (safetensors, read directly by transformers-neuronx)"
    with tqdm(total=2, desc="converting .bin to safetensors") as bar:
        model = load_model(source)
        bar.update()
        model.save_pretrained(target)
        bar.update()
    return f"{target} (converted to safetensors)"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="local Hugging Face model folder")
    parser.add_argument("target", type=Path, help="checkpoint folder to write (may equal source)")
    parser.add_argument("--format", choices=("safetensors", "split"), default="safetensors")
    args = parser.parse_args(argv)
    print(f"checkpoint ready: {prepare(args.source, args.target, args.format)}", file=sys.stderr)


if __name__ == "__main__":
    main()
