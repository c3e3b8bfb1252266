from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.serve.local_asgi import AsgiFrontend
from scripts.serve.local_torchserve import TorchServe

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A handler whose model fails to load in-process (handler/serving/init_failure.py) exits its process
# after this hold; in pytest that would end the run. Tests that want the exit set it lower.
os.environ.setdefault("INF2_INIT_FAILURE_HOLD_S", "3600")
REPO = Path(__file__).resolve().parent.parent
pytest_plugins = ["tests.tiers"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--frontends",
        choices=("both", "torchserve"),
        default="both",
        help="the e2e route tests' servers: TorchServe and the ASGI frontend (both), or TorchServe alone "
        "(make test-compat: the ASGI frontend's own module still runs)",
    )
    parser.addoption(
        "--modes",
        choices=("both", "continuous"),
        default="both",
        help="the e2e tests' TorchServe scheduling modes: continuous and static (both), or continuous alone "
        "(make test-compat: the shipped configs' mode; the in-process tests still run both)",
    )


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default model, built fresh by the project's own script."""
    out = tmp_path_factory.mktemp("tiny-llama")
    subprocess.run([sys.executable, "-m", "scripts.model.make_tiny_model", str(out)], check=True, cwd=REPO)
    return out


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sentence-transformers encoder (random BERT, mean pooling + Normalize, max_seq_length 64),
    built fresh by the project's own script: the stand-in for all-MiniLM-L6-v2."""
    out = tmp_path_factory.mktemp("tiny-encoder")
    subprocess.run(
        [sys.executable, "-m", "scripts.model.make_tiny_encoder", str(out), "--normalize"], check=True, cwd=REPO
    )
    return out


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)


@pytest.fixture(scope="session")
def model_log_softmax(tiny_model_dir: Path):
    """The tiny model's own log-softmax over a token sequence ([positions, vocab]), by a plain
    transformers forward: what served logprobs are checked against."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True).float().eval()

    def logprobs(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            return torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)

    return logprobs


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """torch's intra-op thread count is process-wide: a backend built in-process with
    `handler.cpu_threads` (the hf bench config sets 1) changes it for every later test.
    Put it back after each test."""
    import torch

    before = torch.get_num_threads()
    yield
    if torch.get_num_threads() != before:
        torch.set_num_threads(before)


LOG_TAIL_LINES = 40


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failing test that used a real server gets the tail of its log in its report (TorchServe's
    worker log, or the ASGI frontend's): CI shows only the report, and the workdir is gone with the
    machine."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for name, value in getattr(item, "funcargs", {}).items():
        if isinstance(value, TorchServe | AsgiFrontend):
            report.sections.append((f"{type(value).__name__} {name}: its log (tail)", _log_tail(value)))


def _log_tail(server: TorchServe | AsgiFrontend) -> str:
    lines = server.log_text().splitlines()  # the default log of each: model_log.log, frontend.log
    if not lines:
        return "(no log)"
    return "\n".join(line[:400] for line in lines[-LOG_TAIL_LINES:])
