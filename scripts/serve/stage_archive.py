"""Lay out what torch-model-archiver packs: the handler package, the model config and,
optionally, the checkpoint.

With `--export-path`, torch-model-archiver then packs the stage into `<store>/<name>/`
(no-archive format), with a private TMPDIR (it copies through `$TMPDIR/<name>`, so two
archives of one name would clobber each other in a shared /tmp).

`--extra-files DIR` copies the *contents* of DIR into the archive root, so the stage
holds `handler/` as a folder and the archive keeps it as a package. Without
`--embed-model`, the staged config points at the checkpoint by absolute path, so a
multi-GB checkpoint is not copied; with it, the checkpoint's files are hard-linked into the
stage where the file system allows (torch-model-archiver then makes the one real copy).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# `model_checkpoint_dir: value  # comment` (the value quoted or not)
CHECKPOINT_KEY = re.compile(r"^(?P<key>\s*model_checkpoint_dir:)(?P<value>[^#\n]*?)(?P<comment>\s*#.*)?$", re.MULTILINE)

EMBEDDED_CHECKPOINT = "model"  # the checkpoint's folder inside an archive that embeds it


def link_or_copy(src: str, dst: str) -> str:
    """shutil.copytree's copy_function: a hard link (no bytes copied), else a copy."""
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links not allowed
        shutil.copy2(src, dst)
    return dst


def copy_checkpoint(model_dir: Path, dest: Path) -> None:
    """The checkpoint's files (hidden ones such as .cache/ left out, as the archiver does), hard-linked."""
    shutil.copytree(model_dir, dest, copy_function=link_or_copy, ignore=shutil.ignore_patterns(".*", "__pycache__"))


def check_checkpoint(model_dir: Path) -> None:
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"{model_dir} is not a Hugging Face checkpoint (no config.json)")


def _point_at(match: re.Match[str], checkpoint_ref: str) -> str:
    """The model_checkpoint_dir line set to checkpoint_ref; a line that already says so stays as it is."""
    if match["value"].strip().strip("\"'") == checkpoint_ref:
        return match[0]
    return f'{match["key"]} "{checkpoint_ref}"{match["comment"] or ""}'


def stage_code(config: Path, stage_dir: Path, checkpoint_ref: str) -> None:
    """handler/, profiles/ and model-config.yaml with model_checkpoint_dir set to checkpoint_ref."""
    text = config.read_text()
    if not CHECKPOINT_KEY.search(text):
        raise SystemExit(f"{config} has no handler.model_checkpoint_dir")
    text = CHECKPOINT_KEY.sub(lambda match: _point_at(match, checkpoint_ref), text, count=1)
    shutil.rmtree(stage_dir, ignore_errors=True)
    stage_dir.mkdir(parents=True)
    shutil.copytree(REPO / "handler", stage_dir / "handler", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "profiles", stage_dir / "profiles")  # timing profiles for the sim backend
    (stage_dir / "model-config.yaml").write_text(text)


def stage(model_dir: Path, config: Path, stage_dir: Path, embed_model: bool) -> None:
    check_checkpoint(model_dir)
    stage_code(config, stage_dir, EMBEDDED_CHECKPOINT if embed_model else str(model_dir.resolve()))
    if embed_model:
        copy_checkpoint(model_dir, stage_dir / EMBEDDED_CHECKPOINT)


def run_archiver(stage_dir: Path, model_name: str, store: Path, tmp: Path, handler: Path | None = None) -> Path:
    """torch-model-archiver, no-archive format; it copies through $TMPDIR/<name>, so give it a private one.
    `handler`: the archive's entry point, copied to its root (default: the staged handler/inf2_handler.py)."""
    folder = store / model_name
    shutil.rmtree(folder, ignore_errors=True)
    store.mkdir(parents=True, exist_ok=True)
    tmp.mkdir(parents=True, exist_ok=True)
    archiver = Path(sys.executable).parent / "torch-model-archiver"
    command = [str(archiver), "--model-name", model_name, "--version", "1.0"]
    command += ["--handler", str(handler or stage_dir / "handler" / "inf2_handler.py"), "--extra-files", str(stage_dir)]
    command += ["--config-file", str(stage_dir / "model-config.yaml"), "--archive-format", "no-archive"]
    command += ["--export-path", str(store), "-f"]
    subprocess.run(command, check=True, env={**os.environ, "TMPDIR": str(tmp), "TEMP": str(tmp)})
    shutil.rmtree(tmp, ignore_errors=True)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "model-config.yaml")
    parser.add_argument("--stage", type=Path, required=True)
    parser.add_argument("--embed-model", action="store_true")
    parser.add_argument("--export-path", type=Path, help="also run torch-model-archiver into this model store")
    parser.add_argument("--model-name", default="llama")
    parser.add_argument("--handler", type=Path, help="the archive's entry point (default: handler/inf2_handler.py)")
    args = parser.parse_args()
    stage(args.model_dir, args.config, args.stage, args.embed_model)
    if args.export_path:
        tmp = args.stage.with_name("archiver-tmp")
        folder = run_archiver(args.stage, args.model_name, args.export_path, tmp, args.handler)
        print(f"archive: {folder}")


if __name__ == "__main__":
    main()
