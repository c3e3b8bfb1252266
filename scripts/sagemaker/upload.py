"""Upload a SageMaker model folder to S3 as uncompressed SageMaker model data.

The folder is what `make sagemaker-archive` writes (build/sagemaker/model_store/<name>/:
MAR-INF/MANIFEST.json, the handler, model-config.yaml, the checkpoint with its compiled
Neuron artifacts, deps/cp<XY>/ for the DLC's Python and sagemaker.properties). SageMaker
copies the S3 prefix file by file to /opt/ml/model (`S3DataType=S3Prefix`,
`CompressionType=None`): no multi-GB tar.gz to pack or unpack. A folder that would not
start on the endpoint is refused before any upload.

    python -m scripts.sagemaker.upload --model-dir build/sagemaker/model_store/llama --s3-uri s3://my-bucket/llama-inf2/
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from scripts.sagemaker.common import (
    DEPS_DIR,
    MODEL_CONFIG_NAME,
    PROPERTIES_NAME,
    Findings,
    config_backend,
    config_findings,
    dlc_for,
    load_model_config,
    split_s3_uri,
)

logger = logging.getLogger("sagemaker_upload")
SKIP_DIRS = {"__pycache__", ".git"}
SKIP_SUFFIXES = {".pyc"}
BUILD_HINT = "build it with `make sagemaker-archive MODEL_DIR=...` (or `make sagemaker-upload`, which does)"


def model_files(model_dir: Path) -> list[Path]:
    """Every file to upload, relative to model_dir, in a stable order."""
    if not (model_dir / "MAR-INF" / "MANIFEST.json").is_file():
        raise SystemExit(f"{model_dir} is not a TorchServe model folder (no MAR-INF/MANIFEST.json); {BUILD_HINT}")
    files = []
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if path.is_file() and not SKIP_DIRS.intersection(rel.parts) and path.suffix not in SKIP_SUFFIXES:
            files.append(rel)
    return files


def check_model_folder(model_dir: Path) -> Findings:
    """What would keep the folder from starting in the DLC: errors refuse the upload, warnings are logged."""
    found = Findings()
    if not (model_dir / PROPERTIES_NAME).is_file():
        found.errors.append(f"{model_dir} has no {PROPERTIES_NAME} (the container's TorchServe config); {BUILD_HINT}")
    config = model_dir / MODEL_CONFIG_NAME
    raw = load_model_config(config) if config.is_file() else None
    found.extend(check_deps(model_dir, raw))
    if raw is None:
        found.errors.append(f"{model_dir} has no {MODEL_CONFIG_NAME}; {BUILD_HINT}")
        return found
    checkpoint = model_dir / str((raw.get("handler") or {}).get("model_checkpoint_dir", "model"))
    found.extend(config_findings(raw, checkpoint, str(config)))
    return found


def check_deps(model_dir: Path, raw: dict[str, Any] | None) -> Findings:
    """The bundled dependencies, for the Python of the DLC the config's backend deploys to; a bundle
    for another Python (--python-version) only warns: it needs an --image-uri running that Python."""
    found = Findings()
    dlc = dlc_for(config_backend(raw or {}))
    bundled = sorted(p.parent.name for p in (model_dir / DEPS_DIR).glob("cp*/pydantic-*.dist-info"))
    if Path(dlc.deps_subdir).name in bundled:
        return found
    if bundled:
        found.warnings.append(
            f"{model_dir} bundles the handler's dependencies for {', '.join(bundled)}, not for {dlc.deps_subdir}: "
            f"the default {dlc.backend} image ({dlc.tag}) runs Python {dlc.python_version}, so deploy with "
            "--image-uri of an image whose Python matches"
        )
    else:
        found.errors.append(
            f"{model_dir} has no {dlc.deps_subdir}/ with pydantic (the handler's dependencies for the DLC's Python, "
            f"bundled because nothing is pip-installed on the endpoint); {BUILD_HINT}"
        )
    return found


def upload(s3, model_dir: Path, s3_uri: str) -> str:
    """Upload model_dir under the prefix; returns the prefix URI (slash-terminated) for ModelDataSource."""
    bucket, prefix = split_s3_uri(s3_uri)
    files = model_files(model_dir)
    found = check_model_folder(model_dir)
    for warning in found.warnings:
        logger.warning("warning: %s", warning)
    if found.errors:
        raise SystemExit("\n".join(f"error: {error}" for error in found.errors))
    for rel in files:
        key = prefix + rel.as_posix()
        logger.info("upload %s -> s3://%s/%s", rel, bucket, key)
        s3.upload_file(str(model_dir / rel), bucket, key)  # managed transfer: multipart for large files
    uri = f"s3://{bucket}/{prefix}"
    logger.info("uploaded %d files to %s", len(files), uri)
    return uri


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="the folder `make sagemaker-archive` built")
    parser.add_argument("--s3-uri", required=True, help="s3://bucket/prefix/ to upload under")
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        split_s3_uri(args.s3_uri)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    import boto3

    s3 = boto3.client("s3", region_name=args.region)
    print(upload(s3, args.model_dir, args.s3_uri))


if __name__ == "__main__":
    main()
