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

REPO = Path(__file__).resolve().parent.parent
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
# requirements-archive.txt installed for one Python, in deps/cp<major><minor>/ (deps/cp310 for the
# DLC): the handler entry puts the folder matching its own interpreter first on sys.path, and
# on any other Python (a local 3.11 run) leaves sys.path alone, since compiled wheels such as
# pydantic-core only load on the Python they were built for.
DEPS_DIR = "deps"
DLC_PYTHON_VERSION = "3.10"


def deps_subdir(python_version: str) -> str:
    """'3.10' -> 'deps/cp310'."""
    major, minor = python_version.split(".")[:2]
    return f"{DEPS_DIR}/cp{major}{minor}"


# TorchServe 0.11 (the SDK 2.25 DLC) waits for the model load with responseTimeout; a 7B/13B
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
            f"{where}: responseTimeout={response}s. TorchServe 0.11 (the SDK 2.25 DLC) has no startupTimeout and "
            "waits for the model load with responseTimeout; a 7B/13B load takes minutes, so the worker would be "
            f"killed mid-load. Use at least {LOAD_SAFE_TIMEOUT_S} (configs/model-config-sagemaker-inf2.yaml: 1200). "
            f"Longer is fine: SageMaker ends a non-streaming invocation after {SAGEMAKER_INVOCATION_LIMIT_S}s anyway"
        )
    startup = raw.get("startupTimeout")
    if not isinstance(startup, int) or startup < LOAD_SAFE_TIMEOUT_S:
        warnings.append(
            f"{where}: startupTimeout={startup}: TorchServe 0.12+ images (--image-uri) wait for the model load "
            f"with startupTimeout (default 120 s); set it like responseTimeout (at least {LOAD_SAFE_TIMEOUT_S})"
        )
    return warnings


def _neuronx_findings(handler: dict[str, Any], checkpoint: Path, where: str) -> Findings:
    found = Findings()
    neuronx = handler.get("neuronx") or {}
    compile_on_start = neuronx.get("compile_on_start", True)
    cache_dir = str(neuronx.get("cache_dir", "neuron_cache"))
    if compile_on_start:
        found.warnings.append(
            f"{where}: handler.neuronx.compile_on_start is true: artifacts that do not match make the endpoint "
            "compile for tens of minutes, past the container startup health check; set it to false"
        )
    artifacts = CacheLocation.resolve(cache_dir, checkpoint).artifacts_dir  # where the worker looks
    if not artifacts.is_relative_to(checkpoint):
        found.warnings.append(
            f"{where}: handler.neuronx.cache_dir '{cache_dir}' is outside the model data; the container sees "
            f"only {CONTAINER_MODEL_DIR}: keep the artifacts in the checkpoint (cache_dir: neuron_cache)"
        )
    elif not (artifacts / "manifest.json").is_file():
        message = (
            f"no compiled Neuron artifacts in {artifacts} (no manifest.json): compile first on an inf2 host with "
            f"the same config and SDK (make compile MODEL_DIR=... MODEL_CONFIG=<this config>)"
        )
        if compile_on_start:
            found.warnings.append(f"{message}; otherwise the endpoint compiles at start-up")
        else:
            found.errors.append(f"{message}; with compile_on_start: false the endpoint's worker would fail to load")
    return found


def config_findings(raw: dict[str, Any], checkpoint: Path, where: str) -> Findings:
    """What a SageMaker model-config.yaml gets wrong for the DLC; `checkpoint` holds the weights."""
    found = Findings(warnings=_timeout_findings(raw, where))
    handler = raw.get("handler") or {}
    backend = handler.get("backend", "hf")
    if backend in ("neuronx", "auto"):
        found.extend(_neuronx_findings(handler, checkpoint, where))
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
