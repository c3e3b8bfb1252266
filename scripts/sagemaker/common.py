"""What the SageMaker scripts share: the container's layout and environment, the checks a
SageMaker model folder must pass, names and S3 URIs.

Nothing here talks to AWS; the scripts build their boto3 clients and pass them in, so
tests hand them clients bound to moto or botocore's Stubber.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from handler.neuron.environment import CacheLocation

REPO = Path(__file__).resolve().parents[2]
SAGEMAKER_PROPERTIES = REPO / "serving" / "sagemaker.properties"
SAGEMAKER_MODEL_CONFIG = REPO / "configs" / "model-config-sagemaker-inf2.yaml"
ARCHIVE_REQUIREMENTS = REPO / "requirements-archive.txt"

# Where SageMaker puts the model data in the container, and what the archive adds to it.
CONTAINER_MODEL_DIR = "/opt/ml/model"
PROPERTIES_NAME = "sagemaker.properties"  # the container's TorchServe config (TS_CONFIG_FILE)
PLUGINS_SUBDIR = "plugins"  # the readiness /ping jar; sagemaker.properties' plugins_path names it
# The serving state dir (handler/serving/state.py) in the container: /opt/ml/model is read-only.
CONTAINER_STATE_DIR = "/tmp/inf2-state"
MODEL_CONFIG_NAME = "model-config.yaml"
# requirements-archive.txt installed for one Python, in deps/cp<major><minor>/ (deps/cp310 in the
# neuronx DLC, deps/cp312 in the nxdi one): the handler entry puts the folder matching its own
# interpreter first on sys.path, and on any other Python (a local 3.11 run) leaves sys.path
# alone, since compiled wheels such as pydantic-core only load on the Python they were built for.
DEPS_DIR = "deps"
DLC_REPOSITORY = "pytorch-inference-neuronx"


def deps_subdir(python_version: str) -> str:
    """'3.10' -> 'deps/cp310'."""
    major, minor = python_version.split(".")[:2]
    return f"{DEPS_DIR}/cp{major}{minor}"


def manylinux_platforms(glibc: str) -> tuple[str, ...]:
    """pip's --platform tags for x86_64 wheels that load on this glibc: pip takes the tags
    literally, so every manylinux_2_<minor> level from 2_17 (manylinux2014, which pip widens to
    manylinux2010 and manylinux1 itself) up to the image's glibc."""
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < 17:
        raise ValueError(f"glibc {glibc}: manylinux wheels need glibc 2.17 or later")
    return ("manylinux2014_x86_64", *(f"manylinux_2_{m}_x86_64" for m in range(17, minor + 1)))


@dataclass(frozen=True)
class Dlc:
    """The PyTorch Neuron inference DLC a device backend runs in by default: its tag in
    DLC_REPOSITORY, its CPython (the archive's deps/cp<XY>) and its glibc (the newest manylinux
    wheels that load there). Every one of them runs TorchServe 0.11.0."""

    backend: str
    tag: str
    sdk: str
    python_version: str
    glibc: str

    @property
    def deps_subdir(self) -> str:
        return deps_subdir(self.python_version)

    @property
    def platforms(self) -> tuple[str, ...]:
        return manylinux_platforms(self.glibc)


DLCS = {
    # SDK 2.25, the last release with transformers-neuronx: torch 2.7, CPython 3.10, Ubuntu 22.04.
    "neuronx": Dlc("neuronx", "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "2.25", "3.10", "2.35"),
    # NxD Inference: SDK 2.26-2.31 (2.26.1: py311, Ubuntu 22.04; 2.27 on: torch 2.9, CPython 3.12,
    # Ubuntu 24.04). This project pins SDK 2.28 (requirements-nxdi.txt).
    "nxdi": Dlc("nxdi", "2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04", "2.28", "3.12", "2.39"),
}
# The device sections of model-config.yaml a backend reads, for the checks. `auto` picks neuronx
# in the SDK 2.25 DLC, the default for a config that does not say nxdi.
DEVICE_SECTIONS = {"neuronx": "neuronx", "auto": "neuronx", "nxdi": "nxdi"}


def config_backend(raw: dict[str, Any]) -> str:
    """handler.backend of a model-config.yaml (the handler's default: hf)."""
    return str((raw.get("handler") or {}).get("backend", "hf"))


def config_task(raw: dict[str, Any]) -> str:
    """handler.task of a model-config.yaml (the handler's default: generate)."""
    return "embed" if (raw.get("handler") or {}).get("task") == "embed" else "generate"


def dlc_for(backend: str) -> Dlc:
    """The DLC a config with this handler.backend deploys to by default: nxdi's for nxdi, else
    neuronx's (auto picks neuronx there; hf and sim run on its CPU)."""
    return DLCS.get(backend, DLCS["neuronx"])


# TorchServe 0.11 (in every DLC above) waits for the model load with responseTimeout; a 7B/13B
# load from precompiled artifacts takes minutes. Below this, a warning.
LOAD_SAFE_TIMEOUT_S = 600
SAGEMAKER_INVOCATION_LIMIT_S = 60

# SageMaker names: 1-63 characters, letters, digits and hyphens, not starting with a hyphen.
NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
MAX_NAME = 63


@dataclass(frozen=True)
class Property:
    key: str
    value: str


def read_properties(path: Path = SAGEMAKER_PROPERTIES) -> list[Property]:
    """`key=value` lines of a Java properties file (comments and blank lines skipped)."""
    props: list[Property] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}: '{line}' is not key=value")
        props.append(Property(key.strip(), value.strip()))
    return props


def container_environment() -> dict[str, str]:
    """The container environment: TorchServe reads the archive's sagemaker.properties.

    TS_CONFIG_FILE makes both the torchserve launcher and the frontend use that file instead
    of the one the DLC's SageMaker toolkit writes; the toolkit's command line still names the
    model store and loads /opt/ml/model as the model named `model`. INF2_STATE_DIR is where workers leave the drain and
    failed-start markers that the readiness /ping reads.
    """
    return {
        "TS_CONFIG_FILE": f"{CONTAINER_MODEL_DIR}/{PROPERTIES_NAME}",
        "HF_HUB_OFFLINE": "1",  # weights come with the model data, never from a hub
        "INF2_STATE_DIR": CONTAINER_STATE_DIR,
    }


@dataclass
class Findings:
    """What a check found: errors stop the build or upload, warnings are printed."""

    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Findings) -> None:
        self.errors += other.errors
        self.warnings += other.warnings


def load_model_config(path: Path) -> dict[str, Any]:
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise SystemExit(f"{path}: not a YAML mapping")
    return raw


def _timeout_findings(raw: dict[str, Any], where: str) -> list[str]:
    warnings = []
    response = raw.get("responseTimeout")
    if isinstance(response, int) and response < LOAD_SAFE_TIMEOUT_S:
        warnings.append(
            f"{where}: responseTimeout={response}s. TorchServe 0.11 (the SDK 2.25 and 2.26-2.31 DLCs) has no "
            "startupTimeout and waits for the model load with responseTimeout; a 7B/13B load takes minutes, so "
            f"the worker would be killed mid-load. Use at least {LOAD_SAFE_TIMEOUT_S} "
            "(configs/model-config-sagemaker-inf2.yaml: 1200, the nxdi one: 1800). "
            f"Longer is fine: SageMaker ends a non-streaming invocation after {SAGEMAKER_INVOCATION_LIMIT_S}s anyway"
        )
    startup = raw.get("startupTimeout")
    if not isinstance(startup, int) or startup < LOAD_SAFE_TIMEOUT_S:
        warnings.append(
            f"{where}: startupTimeout={startup}: TorchServe 0.12+ images (--image-uri) wait for the model load "
            f"with startupTimeout (default 120 s); set it like responseTimeout (at least {LOAD_SAFE_TIMEOUT_S})"
        )
    return warnings


def _device_findings(handler: dict[str, Any], section: str, checkpoint: Path, where: str) -> Findings:
    """The checks of a device section, `handler.<section>` (neuronx, nxdi): both keep their
    compiled artifacts in <checkpoint>/<cache_dir>/artifacts with our manifest.json."""
    found = Findings()
    settings = handler.get(section) or {}
    key = f"handler.{section}"
    compile_on_start = settings.get("compile_on_start", True)
    cache_dir = str(settings.get("cache_dir", "neuron_cache"))
    if compile_on_start:
        found.warnings.append(
            f"{where}: {key}.compile_on_start is true: artifacts that do not match make the endpoint "
            "compile for tens of minutes, past the container startup health check; set it to false"
        )
    artifacts = CacheLocation.resolve(cache_dir, checkpoint).artifacts_dir  # where the worker looks
    sdk = dlc_for(section).sdk
    hint = f"make compile MODEL_DIR=... MODEL_CONFIG=<this config>; the default {section} image runs SDK {sdk}"
    if not artifacts.is_relative_to(checkpoint):
        message = (
            f"{where}: {key}.cache_dir '{cache_dir}' is outside the model data; the container sees only "
            f"{CONTAINER_MODEL_DIR}: keep the artifacts in the checkpoint (cache_dir: neuron_cache)"
        )
        if compile_on_start:
            found.warnings.append(f"{message}; otherwise the endpoint compiles at start-up")
        else:
            found.errors.append(f"{message}; with compile_on_start: false the endpoint's worker would fail to load")
    elif not (artifacts / "manifest.json").is_file():
        message = (
            f"no compiled Neuron artifacts in {artifacts} (no manifest.json): compile first on an inf2 host with "
            f"the same config and SDK ({hint})"
        )
        if compile_on_start:
            found.warnings.append(f"{message}; otherwise the endpoint compiles at start-up")
        else:
            found.errors.append(f"{message}; with compile_on_start: false the endpoint's worker would fail to load")
    if section == "nxdi":
        found.extend(_nxdi_findings(settings, where))
    return found


def _nxdi_findings(settings: dict[str, Any], where: str) -> Findings:
    found = Findings()
    if settings.get("save_sharded_checkpoint", True) is False:
        found.warnings.append(
            f"{where}: handler.nxdi.save_sharded_checkpoint is false: the artifacts then hold no sharded weights "
            "and NxDI's load() re-shards the checkpoint in host RAM (an 8B model exhausts an ml.inf2.xlarge's "
            "16 GB), reading it from the path it had on the compile host; set it to true and recompile"
        )
    return found


def config_findings(raw: dict[str, Any], checkpoint: Path, where: str) -> Findings:
    """What a SageMaker model-config.yaml gets wrong for the DLC; `checkpoint` holds the weights."""
    found = Findings(warnings=_timeout_findings(raw, where))
    backend = config_backend(raw)
    section = DEVICE_SECTIONS.get(backend)
    if section is not None:
        found.extend(_device_findings(raw.get("handler") or {}, section, checkpoint, where))
    else:
        found.warnings.append(f"{where}: handler.backend is '{backend}': the model runs on the instance's CPU")
    return found


def check_name(name: str, what: str) -> str:
    if len(name) > MAX_NAME or not NAME.match(name):
        raise ValueError(f"{what} '{name}' must be 1-{MAX_NAME} letters, digits or hyphens (no leading hyphen)")
    return name


def split_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix -> ("bucket", "some/prefix/"): a folder prefix, slash-terminated."""
    match = re.match(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?$", uri)
    if not match:
        raise ValueError(f"'{uri}' is not an s3://bucket/prefix URI")
    prefix = (match.group(2) or "").strip("/")
    return match.group(1), f"{prefix}/" if prefix else ""
