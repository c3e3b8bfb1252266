"""The ASGI frontend in-process (tests/support/asgi_inprocess.py): one app over the sim backend for
the package, and one in SageMaker mode, each loaded once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.frontend.app import Limits
from handler.frontend.model import ServedModel
from tests.support.asgi_inprocess import InProcessFrontend, running_in_process, sim_config

BODY_LIMIT = 64 * 1024  # a small limit: a 413 without sending megabytes


@pytest.fixture(scope="package")
def frontend(tiny_model_dir: Path) -> Iterator[InProcessFrontend]:
    model = ServedModel(sim_config(tiny_model_dir), tiny_model_dir)
    with running_in_process(model, limits=Limits(max_body_bytes=BODY_LIMIT)) as served:
        yield served


@pytest.fixture(scope="package")
def sagemaker_frontend(tiny_model_dir: Path) -> Iterator[InProcessFrontend]:
    """SageMaker mode: /ping and /invocations need no key (the platform authenticates its callers)."""
    model = ServedModel(sim_config(tiny_model_dir), tiny_model_dir)
    with running_in_process(model, model_name="model", sagemaker=True) as served:
        yield served
