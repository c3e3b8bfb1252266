"""Build the model folder a SageMaker endpoint loads from your checkpoint and a SageMaker config.

The result is a TorchServe model folder (torch-model-archiver `no-archive` format) that
holds everything the PyTorch Neuron DLC needs and nothing it has to fetch:

    MAR-INF/MANIFEST.json, inf2_handler.py, handler/, profiles/
    model-config.yaml      your SageMaker config, model_checkpoint_dir pointing at model/
    model/                 your checkpoint, compiled Neuron artifacts (neuron_cache/) included
    deps/cp<XY>/           requirements-archive.txt installed for the DLC's Python (manylinux
                           x86_64 wheels): deps/cp310 for backend neuronx (the SDK 2.25 DLC),
                           deps/cp312 for backend nxdi (the SDK 2.28 DLC); the handler entry
                           puts it first on sys.path when it runs on that Python. With LoRA
                           adapters on backend hf, also peft and accelerate (--no-deps)
    <adapter folders>      handler.lora.adapters' folders: a relative path (or one under
                           /opt/ml/model) is read beside the config and lands at that path here,
                           where the handler looks; their two PEFT files, hard-linked
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
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from packaging.requirements import Requirement

from handler.lora.adapters import CONFIG_FILE, WEIGHTS_FILE, AdapterError, read_adapter
from scripts.sagemaker.common import (
    ARCHIVE_REQUIREMENTS,
    CONTAINER_MODEL_DIR,
    DEPS_DIR,
    MODEL_CONFIG_NAME,
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
from scripts.serve.stage_archive import (
    EMBEDDED_CHECKPOINT,
    check_checkpoint,
    copy_checkpoint,
    link_or_copy,
    run_archiver,
    stage_code,
)

# The hf backend serves LoRA adapters with peft (handler/backends/hf_lora.py), which no DLC has. peft
# depends on torch, transformers and accelerate: with its dependencies, pip would put PyPI's torch and
# transformers into deps/, first on sys.path, over the DLC's builds. So an archive whose config serves
# adapters on backend hf gets peft and accelerate (which peft imports at once) installed with --no-deps,
# pinned as the test stack of the same Python pins them: requirements-compat.txt (Python 3.10,
# transformers 4.48 and torch 2.7 as in the SDK 2.25 DLC; also for 3.11) or requirements-py312.txt
# (3.12, transformers 4.57 and torch 2.9 as in the SDK 2.28 DLC). Their other dependencies (numpy,
# packaging, psutil, pyyaml, tqdm, safetensors, huggingface-hub) come with the DLC's transformers and
# torchserve. nxdi serves adapters with NxD Inference: no peft.
LORA_PACKAGES = ("peft", "accelerate")
LORA_PINS = {"3.10": REPO / "requirements-compat.txt", "3.12": REPO / "requirements-py312.txt"}
# What an adapter folder may not land on: the archive's own top-level entries (model/ is the
# checkpoint: an adapter there comes from MODEL_DIR, with it).
ARCHIVE_ENTRIES = frozenset(
    {"MAR-INF", "handler", "profiles", "inf2_handler.py", MODEL_CONFIG_NAME, DEPS_DIR, PROPERTIES_NAME, PLUGINS_SUBDIR}
)


@dataclass(frozen=True)
class ArchivedAdapter:
    """A LoRA adapter of handler.lora.adapters: its folder on this machine and in the archive.

    The handler resolves a relative adapter path against the model folder (the archive's root,
    /opt/ml/model on the endpoint) and `make compile` against the config's folder, so a relative
    path is looked up beside the config and lands at the same path in the archive; one under
    model/ is the checkpoint's (MODEL_DIR/...) and comes with it."""

    name: str
    source: Path
    archived: PurePosixPath  # relative to the archive's root

    @property
    def in_checkpoint(self) -> bool:
        return self.archived.parts[0] == EMBEDDED_CHECKPOINT


def validate_config(config: Path) -> None:
    """The handler's own parser: a typo fails here, not 20 minutes into a deployment."""
    from handler.config import ServingConfig
    from handler.errors import ConfigError

    try:
        ServingConfig.from_model_yaml(load_model_config(config))
    except ConfigError as exc:
        raise SystemExit(f"{config}: {exc}") from None


def check_sources(model_dir: Path, config: Path) -> list[ArchivedAdapter]:
    """The checkpoint, the config and its LoRA adapters; returns the adapters to archive."""
    check_checkpoint(model_dir)
    validate_config(config)
    raw = load_model_config(config)
    findings = config_findings(raw, model_dir, str(config))
    adapters, errors = plan_adapters(raw, config, model_dir)
    findings.errors += errors
    for warning in findings.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if findings.errors:
        raise SystemExit("\n".join(f"error: {error}" for error in findings.errors))
    return adapters


def archived_path(path: str) -> PurePosixPath | str:
    """Where an adapter path of the config is inside the archive, or why it is not: a relative path
    is, and so is an absolute one under /opt/ml/model (the archive on the endpoint); any other
    absolute path is outside the model data, which is all the endpoint has."""
    posix = PurePosixPath(path)
    if posix.is_absolute():
        if not posix.is_relative_to(CONTAINER_MODEL_DIR):
            return (
                f"{path} is outside the model data: the endpoint has only {CONTAINER_MODEL_DIR}, so its start would "
                "fail; write a path relative to the config's folder, and the archive carries the adapter"
            )
        posix = posix.relative_to(CONTAINER_MODEL_DIR)
    if ".." in posix.parts or not posix.parts:
        return f"{path} is not a folder inside the archive; write a path below the config's folder"
    if posix.parts[0] in ARCHIVE_ENTRIES:
        return f"{path} is inside the archive's own {posix.parts[0]}; put the adapter in a folder of its own"
    return posix


def plan_adapters(raw: dict[str, Any], config: Path, model_dir: Path) -> tuple[list[ArchivedAdapter], list[str]]:
    """handler.lora.adapters as the archive holds them, each checked as the endpoint's start will
    check it (files, rank; shapes against a Llama-family checkpoint), and the errors."""
    from handler.config import ServingConfig
    from handler.neuron.lora import LORA_MODEL_TYPES, llama_lora_shapes, read_config_json

    lora = ServingConfig.from_model_yaml(raw).handler.lora
    if lora is None or not lora.adapters:
        return [], []
    hf_config = read_config_json(model_dir) or {}
    shapes = llama_lora_shapes(hf_config) if hf_config.get("model_type") in LORA_MODEL_TYPES else None
    adapters, errors = [], []
    for name, path in lora.adapters.items():
        where = f"{config}: handler.lora.adapters.{name}"
        archived = archived_path(path)
        if isinstance(archived, str):
            errors.append(f"{where}: {archived}")
            continue
        adapter = ArchivedAdapter(name, config.parent / archived, archived)
        if adapter.in_checkpoint:
            adapter = ArchivedAdapter(name, model_dir.joinpath(*archived.parts[1:]), archived)
        missing = [file for file in (CONFIG_FILE, WEIGHTS_FILE) if not (adapter.source / file).is_file()]
        try:
            if missing:
                raise AdapterError(f"no {' or '.join(missing)} in {adapter.source}")
            if shapes is not None:
                read_adapter(name, adapter.source, lora.max_lora_rank, shapes)
        except AdapterError as exc:
            errors.append(f"{where}: {exc} (read from the config's folder; a path under model/ from MODEL_DIR)")
            continue
        adapters.append(adapter)
    return adapters, errors


def copy_adapters(adapters: Sequence[ArchivedAdapter], folder: Path) -> None:
    """Each adapter's two files into the archive (hard links, as the checkpoint's); the rest of its
    folder (a training run's checkpoints, optimizer states) stays out. One under model/ came with
    the checkpoint."""
    for adapter in adapters:
        if adapter.in_checkpoint:
            continue
        dest = folder.joinpath(*adapter.archived.parts)
        dest.mkdir(parents=True, exist_ok=True)
        for file in (CONFIG_FILE, WEIGHTS_FILE):
            if not (dest / file).exists():  # two names for one folder: one copy
                link_or_copy(str(adapter.source / file), str(dest / file))
        print(f"LoRA adapter {adapter.name}: {adapter.source} -> {adapter.archived}", file=sys.stderr)


def serves_hf_adapters(raw: dict[str, Any]) -> bool:
    """Whether the config serves LoRA adapters on backend hf (with peft, which the archive must bring)."""
    lora = (raw.get("handler") or {}).get("lora") or {}
    return config_backend(raw) == "hf" and bool(lora.get("adapters"))


def lora_pins(python_version: str) -> list[str]:
    """peft and accelerate as the test stack of that Python pins them (LORA_PINS)."""
    major, minor = (int(part) for part in python_version.split(".")[:2])
    source = LORA_PINS["3.12" if (major, minor) >= (3, 12) else "3.10"]
    pins: dict[str, str] = {}
    for line in source.read_text().splitlines():
        text = line.split("#")[0].strip()
        if text and (name := Requirement(text).name.lower()) in LORA_PACKAGES:
            pins[name] = text
    missing = [name for name in LORA_PACKAGES if name not in pins]
    if missing:
        raise SystemExit(f"{source} pins no {', '.join(missing)}: the archive bundles what the tests ran")
    return [pins[name] for name in LORA_PACKAGES]


def pip_target_command(requirements: Path, target: Path, python_version: str, platforms: Sequence[str]) -> list[str]:
    """pip installing wheels for another interpreter: CPython `python_version` on x86_64 Linux
    with the given manylinux `platforms` (the DLC's glibc: Dlc.platforms)."""
    return [*_pip_target(target, python_version, platforms), "-r", str(requirements)]


def pip_no_deps_command(pins: Sequence[str], target: Path, python_version: str, platforms: Sequence[str]) -> list[str]:
    """The same for these requirement specifiers alone, without their dependencies."""
    return [*_pip_target(target, python_version, platforms), "--no-deps", *pins]


def _pip_target(target: Path, python_version: str, platforms: Sequence[str]) -> list[str]:
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
    ]


def bundle_dependencies(requirements: Path, target: Path, python_version: str, platforms: Sequence[str]) -> None:
    """requirements-archive.txt as wheels for the DLC's Python, unpacked into target."""
    shutil.rmtree(target, ignore_errors=True)
    subprocess.run(pip_target_command(requirements, target, python_version, platforms), check=True)
    shutil.rmtree(target / "bin", ignore_errors=True)  # console scripts: nothing runs them
    if not any(target.glob("*.dist-info")):
        raise SystemExit(f"pip installed nothing into {target} from {requirements}")


def bundle_without_deps(pins: Sequence[str], target: Path, python_version: str, platforms: Sequence[str]) -> None:
    """`pins` beside the bundled dependencies, without theirs: the DLC has those (LORA_PACKAGES)."""
    subprocess.run(pip_no_deps_command(pins, target, python_version, platforms), check=True)
    shutil.rmtree(target / "bin", ignore_errors=True)


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
    adapters = check_sources(model_dir, config)  # first: a refused checkpoint or adapter builds nothing
    raw = load_model_config(config)
    dlc = dlc_for(config_backend(raw))
    python_version = deps_python(dlc, python_version)
    plugins_jar = build_plugins(plugins_dir)
    stage_dir = build_dir / "stage"
    stage_code(config, stage_dir, EMBEDDED_CHECKPOINT)
    deps = stage_dir / deps_subdir(python_version)
    bundle_dependencies(requirements, deps, python_version, dlc.platforms)
    if serves_hf_adapters(raw):
        pins = lora_pins(python_version)
        print(f"LoRA adapters on backend hf: bundling {', '.join(pins)} without dependencies", file=sys.stderr)
        bundle_without_deps(pins, deps, python_version, dlc.platforms)
    shutil.copy2(SAGEMAKER_PROPERTIES, stage_dir / PROPERTIES_NAME)
    folder = run_archiver(stage_dir, model_name, build_dir / "model_store", build_dir / "tmp")
    copy_checkpoint(model_dir, folder / EMBEDDED_CHECKPOINT)
    copy_adapters(adapters, folder)
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
