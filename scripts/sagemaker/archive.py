"""Build the model folder a SageMaker endpoint loads from your checkpoint and a SageMaker config.

The result is a TorchServe model folder (torch-model-archiver `no-archive` format) that
holds everything the PyTorch Neuron DLC needs and nothing it has to fetch:

    MAR-INF/MANIFEST.json, inf2_handler.py, handler/, profiles/
    model-config.yaml      your SageMaker config, model_checkpoint_dir pointing at model/
    model/                 your checkpoint, compiled Neuron artifacts (neuron_cache/) included
    deps/cp<XY>/           requirements-archive.txt installed for the DLC's Python (manylinux
                           x86_64 wheels): deps/cp310 for backend neuronx (the SDK 2.25 DLC),
                           deps/cp312 for backend nxdi (the SDK 2.28 DLC); the handler entry
                           puts it first on sys.path when it runs on that Python
    sagemaker.properties   the container's TorchServe config (TS_CONFIG_FILE, set by the deploy)
    plugins/               the readiness /ping (scripts/serve/build_plugins.py; plugins_path in sagemaker.properties)

Nothing is pip-installed when the model loads, so endpoints without internet access (a VPC
without NAT, network isolation) work too. Building needs PyPI (or a mirror in pip's
configuration: PIP_INDEX_URL, PIP_FIND_LINKS + PIP_NO_INDEX=1 for a local wheelhouse).

    python -m scripts.sagemaker.archive --model-dir models/llama-2-7b --build-dir build/sagemaker
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from scripts.sagemaker.common import (
    ARCHIVE_REQUIREMENTS,
    PLUGINS_SUBDIR,
    PROPERTIES_NAME,
    REPO,
    SAGEMAKER_MODEL_CONFIG,
    SAGEMAKER_PROPERTIES,
    Dlc,
    config_backend,
    config_findings,
    deps_subdir,
    dlc_for,
    load_model_config,
)
from scripts.serve.build_plugins import PLUGINS_DIR
from scripts.serve.build_plugins import build as build_plugins
from scripts.serve.stage_archive import EMBEDDED_CHECKPOINT, check_checkpoint, copy_checkpoint, run_archiver, stage_code


def validate_config(config: Path) -> None:
    """The handler's own parser: a typo fails here, not 20 minutes into a deployment."""
    from handler.config import ServingConfig
    from handler.errors import ConfigError

    try:
        ServingConfig.from_model_yaml(load_model_config(config))
    except ConfigError as exc:
        raise SystemExit(f"{config}: {exc}") from None


def check_sources(model_dir: Path, config: Path) -> None:
    check_checkpoint(model_dir)
    validate_config(config)
    findings = config_findings(load_model_config(config), model_dir, str(config))
    for warning in findings.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if findings.errors:
        raise SystemExit("\n".join(f"error: {error}" for error in findings.errors))


def pip_target_command(requirements: Path, target: Path, python_version: str, platforms: Sequence[str]) -> list[str]:
    """pip installing wheels for another interpreter: CPython `python_version` on x86_64 Linux
    with the given manylinux `platforms` (the DLC's glibc: Dlc.platforms)."""
    abi = "cp" + python_version.replace(".", "")
    platform_args = [arg for platform in platforms for arg in ("--platform", platform)]
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
        "--target",
        str(target),
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        python_version,
        "--abi",
        abi,
        *platform_args,
        "-r",
        str(requirements),
    ]


def bundle_dependencies(requirements: Path, target: Path, python_version: str, platforms: Sequence[str]) -> None:
    """requirements-archive.txt as wheels for the DLC's Python, unpacked into target."""
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(pip_target_command(requirements, target, python_version, platforms), check=True)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: nothing runs them
    if not any(target.glob("*.dist-info")):
        raise SystemExit(f"pip installed nothing into {target} from {requirements}")


def deps_python(dlc: Dlc, override: str | None) -> str:
    """The Python the deps are built for: the DLC's, or the override (with a warning when they differ)."""
    if override and override != dlc.python_version:
        print(
            f"warning: deps for Python {override} ({deps_subdir(override)}), but the default {dlc.backend} image "
            f"({dlc.tag}) runs Python {dlc.python_version}: deploy with --image-uri of an image running {override}",
            file=sys.stderr,
        )
    python_version = override or dlc.python_version
    print(
        f"bundling the handler's dependencies for CPython {python_version} ({deps_subdir(python_version)}, "
        f"manylinux up to glibc {dlc.glibc}): backend {dlc.backend}, DLC {dlc.tag}",
        file=sys.stderr,
    )
    return python_version


def build(
    model_dir: Path,
    config: Path,
    model_name: str,
    build_dir: Path,
    requirements: Path = ARCHIVE_REQUIREMENTS,
    python_version: str | None = None,
    plugins_dir: Path = PLUGINS_DIR,
) -> Path:
    """Check the sources, then stage code, config, deps and properties; archive them; then add
    the checkpoint (hard links) and the /ping plugin (built into `plugins_dir` if stale).

    The deps are for the Python of the DLC the config's backend deploys to (dlc_for), unless
    `python_version` says otherwise (an --image-uri with another Python)."""
    check_sources(model_dir, config)  # first: a refused checkpoint builds nothing
    dlc = dlc_for(config_backend(load_model_config(config)))
    python_version = deps_python(dlc, python_version)
    plugins_jar = build_plugins(plugins_dir)
    stage_dir = build_dir / "stage"
    stage_code(config, stage_dir, EMBEDDED_CHECKPOINT)
    bundle_dependencies(requirements, stage_dir / deps_subdir(python_version), python_version, dlc.platforms)
    shutil.copy2(SAGEMAKER_PROPERTIES, stage_dir / PROPERTIES_NAME)
    folder = run_archiver(stage_dir, model_name, build_dir / "model_store", build_dir / "tmp")
    copy_checkpoint(model_dir, folder / EMBEDDED_CHECKPOINT)
    (folder / PLUGINS_SUBDIR).mkdir()
    shutil.copy2(plugins_jar, folder / PLUGINS_SUBDIR / plugins_jar.name)
    shutil.rmtree(stage_dir)
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="your checkpoint (compiled with make compile)")
    parser.add_argument("--config", type=Path, default=SAGEMAKER_MODEL_CONFIG, help="the SageMaker model-config")
    parser.add_argument("--model-name", default="llama")
    parser.add_argument("--build-dir", type=Path, default=REPO / "build" / "sagemaker", help="stage + model_store/")
    parser.add_argument("--requirements", type=Path, default=ARCHIVE_REQUIREMENTS)
    parser.add_argument(
        "--python-version",
        default=None,
        help="the image's Python, for deps/cpXY; default: the DLC's for the config's backend (neuronx 3.10, nxdi 3.12)",
    )
    parser.add_argument("--plugins-dir", type=Path, default=PLUGINS_DIR, help="where the /ping plugin jar is built")
    args = parser.parse_args(argv)
    folder = build(
        args.model_dir,
        args.config,
        args.model_name,
        args.build_dir,
        args.requirements,
        args.python_version,
        args.plugins_dir,
    )
    print(f"sagemaker archive: {folder}")


if __name__ == "__main__":
    main()
