"""The test tiers (docs/testing.md), marked by folder and enforced here, so that a mark cannot lie:

- tests/unit         pure functions and single classes, in-process
- tests/integration  the handler, engine and backends together, in-process (fake SDKs, tiny model)
- tests/e2e          everything that starts a server (a real torchserve)
- tests/real_model   the real default model (SmolLM2-135M-Instruct, `make model`) served by a real
                     torchserve: answers that must make sense, not only be well-formed
- tests/perf         soaks, benchmark runs and lm-eval against the real model: `make test-perf`,
                     not `make test`

Every test file lives in one of them (a collection error says so otherwise), each test gets its
tier's marker, and a test outside e2e/perf that launches torchserve fails, naming the folder it
belongs in.
"""

from __future__ import annotations

import subprocess
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "e2e", "real_model", "perf")
SERVER_TIERS = ("e2e", "real_model", "perf")


def tier_of(path: Path) -> str | None:
    """The tier folder a test file lives in, or None."""
    try:
        top = path.resolve().relative_to(TESTS).parts[0]
    except (ValueError, IndexError):
        return None
    return top if top in TIERS else None


def pytest_configure(config: pytest.Config) -> None:
    for tier in TIERS:
        config.addinivalue_line("markers", f"{tier}: a test of the tests/{tier} tier (set by its folder)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    strays = sorted({str(item.path.relative_to(TESTS.parent)) for item in items if tier_of(item.path) is None})
    if strays:
        raise pytest.UsageError(f"test files outside the tiers {', '.join(TIERS)} (docs/testing.md): {strays}")
    for item in items:
        item.add_marker(tier_of(item.path))


def argv_of(args: Any) -> list[str]:
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()


def starts_a_server(args: Any) -> bool:
    """`torchserve --start ...` (what the tests' TorchServe harness runs) or `make serve`."""
    argv = argv_of(args)
    if not argv:
        return False
    program = Path(argv[0]).name
    return (program == "torchserve" and "--start" in argv) or (program == "make" and "serve" in argv[1:])


class _NoServerPopen(subprocess.Popen):
    tier = "unit"

    def __init__(self, args: Any, *rest: Any, **kwargs: Any) -> None:
        if starts_a_server(args):
            self._child_created = False  # nothing for Popen.__del__ to reap
            raise RuntimeError(
                f"a test of tests/{self.tier} starts a server ({Path(argv_of(args)[0]).name}): "
                "move it to tests/e2e (or tests/perf), docs/testing.md"
            )
        super().__init__(args, *rest, **kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, object, object]:
    """Setup, call and teardown of a test outside e2e/perf run with a Popen that refuses to
    start torchserve (its module- and package-scoped fixtures are set up inside this too)."""
    tier = tier_of(item.path)
    if tier in SERVER_TIERS:
        return (yield)
    guard = type("NoServerPopen", (_NoServerPopen,), {"tier": tier})
    original = subprocess.Popen
    subprocess.Popen = guard  # type: ignore[misc]
    try:
        return (yield)
    finally:
        subprocess.Popen = original  # type: ignore[misc]
