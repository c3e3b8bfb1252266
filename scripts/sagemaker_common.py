"""What the SageMaker scripts share: the container's TorchServe settings, names, S3 URIs.

Nothing here talks to AWS; the scripts build their boto3 clients and pass them in, so
tests hand them clients bound to moto.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAGEMAKER_PROPERTIES = REPO / "serving" / "sagemaker.properties"
ENV_MARK = "[env]"
# SageMaker names: 1-63 characters, letters, digits and hyphens, not starting with a hyphen.
NAME = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
MAX_NAME = 63


@dataclass(frozen=True)
class Property:
    key: str
    value: str
    env: bool  # passed to the container as TS_<KEY>


def read_properties(path: Path = SAGEMAKER_PROPERTIES) -> list[Property]:
    """`key=value` lines; a comment block starting with `# [env]` marks the next key."""
    props: list[Property] = []
    marked = False
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line:
            marked = False
        elif line.startswith("#"):
            marked = marked or line.lstrip("# ").startswith(ENV_MARK)
        else:
            key, sep, value = line.partition("=")
            if not sep:
                raise ValueError(f"{path}: '{line}' is not key=value")
            props.append(Property(key.strip(), value.strip(), marked))
            marked = False
    return props


def container_environment(path: Path = SAGEMAKER_PROPERTIES) -> dict[str, str]:
    """The TS_<KEY> variables that carry the [env] properties into the DLC's torchserve.

    Addresses, model store and load_models are left to the SageMaker toolkit: it binds
    the platform's port and loads /opt/ml/model as the model named `model`.
    """
    env = {f"TS_{p.key.upper()}": p.value for p in read_properties(path) if p.env}
    env["HF_HUB_OFFLINE"] = "1"  # weights come with the model data, never from a hub
    return env


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
