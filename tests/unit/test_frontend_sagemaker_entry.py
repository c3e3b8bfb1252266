"""handler/frontend/sagemaker.py: what SageMaker's `docker run <image> serve` becomes (the real start is
tests/e2e/test_asgi_frontend.py's SIGTERM test)."""

from __future__ import annotations

from pathlib import Path

import pytest

from handler.frontend import sagemaker
from handler.frontend.__main__ import parse_args
from handler.frontend.auth import KEY_ENV


def test_the_container_defaults_are_sagemakers_contract():
    args = parse_args(sagemaker.frontend_argv({}))
    assert args.config == Path("/opt/ml/model/model-config.yaml")
    assert (args.host, args.port, args.sagemaker, args.model_name) == ("0.0.0.0", 8080, True, "model")
    assert args.key_file == Path("/tmp/frontend-key.txt") and not args.no_auth


def test_the_environment_overrides_paths_port_name_and_key():
    environ = {"SM_MODEL_DIR": "/data/m", "SAGEMAKER_BIND_TO_PORT": "9001", "INF2_MODEL_NAME": "minilm"}
    args = parse_args(sagemaker.frontend_argv({**environ, KEY_ENV: "k"}))
    assert (args.config, args.port, args.model_name, args.key_file) == (
        Path("/data/m/model-config.yaml"),
        9001,
        "minilm",
        None,
    )
    assert parse_args(sagemaker.frontend_argv({"INF2_KEY_FILE": "/run/k"})).key_file == Path("/run/k")


def test_only_serve_or_nothing_and_the_config_must_be_there(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"\[serve\]"):
        sagemaker.main(["train"])
    monkeypatch.setenv("SM_MODEL_DIR", str(tmp_path))
    with pytest.raises(SystemExit, match=r"model-config\.yaml is missing"):
        sagemaker.main(["serve"])
