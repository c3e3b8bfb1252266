"""Lay out what torch-model-archiver packs: the handler package, the model config and,
optionally, the checkpoint.

`--extra-files DIR` copies the *contents* of DIR into the archive root, so the stage
holds `handler/` as a folder and the archive keeps it as a package. Without
`--embed-model`, the staged config points at the checkpoint by absolute path, so a
multi-GB checkpoint is not copied.
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKPOINT_KEY = re.compile(r"^(\s*model_checkpoint_dir:).*$", re.MULTILINE)


def stage(model_dir: Path, config: Path, stage_dir: Path, embed_model: bool) -> None:
    if not (model_dir / "config.json").exists():
        raise SystemExit(f"{model_dir} is not a Hugging Face checkpoint (no config.json)")
    shutil.rmtree(stage_dir, ignore_errors=True)
    stage_dir.mkdir(parents=True)
    shutil.copytree(REPO / "handler", stage_dir / "handler", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "profiles", stage_dir / "profiles")  # timing profiles for the sim backend
    text = config.read_text()
    if embed_model:
        shutil.copytree(model_dir, stage_dir / "model")
        target = "model"
    else:
        target = str(model_dir.resolve())
    if not CHECKPOINT_KEY.search(text):
        raise SystemExit(f"{config} has no handler.model_checkpoint_dir")
    (stage_dir / "model-config.yaml").write_text(CHECKPOINT_KEY.sub(rf'\1 "{target}"', text, count=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--config", type=Path, default=REPO / "model-config.yaml")
    parser.add_argument("--stage", type=Path, required=True)
    parser.add_argument("--embed-model", action="store_true")
    args = parser.parse_args()
    stage(args.model_dir, args.config, args.stage, args.embed_model)


if __name__ == "__main__":
    main()
