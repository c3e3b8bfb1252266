"""Upload a TorchServe model folder to S3 as uncompressed SageMaker model data.

The folder is what `make archive` writes with `--archive-format no-archive`
(model_store/<name>/ with MAR-INF/MANIFEST.json, the handler, model-config.yaml, and
the checkpoint plus compiled Neuron artifacts when they are inside). SageMaker copies
the S3 prefix file by file to /opt/ml/model (`S3DataType=S3Prefix`,
`CompressionType=None`): no multi-GB tar.gz to pack or unpack.

    python scripts/sagemaker_upload.py --model-dir model_store/llama --s3-uri s3://my-bucket/llama-inf2/
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.sagemaker_common import split_s3_uri

logger = logging.getLogger("sagemaker_upload")
SKIP_DIRS = {"__pycache__", ".git"}
SKIP_SUFFIXES = {".pyc"}
SAGEMAKER_INVOCATION_LIMIT_S = 60


def model_files(model_dir: Path) -> list[Path]:
    """Every file to upload, relative to model_dir, in a stable order."""
    if not (model_dir / "MAR-INF" / "MANIFEST.json").is_file():
        raise SystemExit(
            f"{model_dir} is not a TorchServe model folder (no MAR-INF/MANIFEST.json); "
            "build it with `make archive` (no-archive format) first"
        )
    files = []
    for path in sorted(model_dir.rglob("*")):
        rel = path.relative_to(model_dir)
        if path.is_file() and not SKIP_DIRS.intersection(rel.parts) and path.suffix not in SKIP_SUFFIXES:
            files.append(rel)
    return files


def check_timeouts(model_dir: Path) -> list[str]:
    """Warnings for a model-config.yaml whose responseTimeout outlasts a SageMaker invocation."""
    config = model_dir / "model-config.yaml"
    if not config.is_file():
        return []
    timeout = (yaml.safe_load(config.read_text()) or {}).get("responseTimeout")
    if isinstance(timeout, int) and timeout > SAGEMAKER_INVOCATION_LIMIT_S:
        return [
            f"{config}: responseTimeout={timeout}s is above SageMaker's {SAGEMAKER_INVOCATION_LIMIT_S}s per "
            "non-streaming invocation; a stuck worker would outlive the client's request"
        ]
    return []


def upload(s3, model_dir: Path, s3_uri: str) -> str:
    """Upload model_dir under the prefix; returns the prefix URI (slash-terminated) for ModelDataSource."""
    bucket, prefix = split_s3_uri(s3_uri)
    files = model_files(model_dir)
    for warning in check_timeouts(model_dir):
        logger.warning(warning)
    for rel in files:
        key = prefix + rel.as_posix()
        logger.info("upload %s -> s3://%s/%s", rel, bucket, key)
        s3.upload_file(str(model_dir / rel), bucket, key)  # managed transfer: multipart for large files
    uri = f"s3://{bucket}/{prefix}"
    logger.info("uploaded %d files to %s", len(files), uri)
    return uri


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="model_store/<name> from `make archive`")
    parser.add_argument("--s3-uri", required=True, help="s3://bucket/prefix/ to upload under")
    parser.add_argument("--region", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import boto3

    s3 = boto3.client("s3", region_name=args.region)
    print(upload(s3, args.model_dir, args.s3_uri))


if __name__ == "__main__":
    main()
