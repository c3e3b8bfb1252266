"""The ASGI frontend's bearer key (handler/frontend/auth.py): from a file written when absent, or
the environment; a rewritten file is the new key at the next check; never anything but Bearer."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from handler.frontend.auth import KEY_ENV, BearerKey


def test_a_missing_file_gets_a_fresh_private_key(tmp_path: Path):
    path = tmp_path / "keys" / "key.txt"
    key = BearerKey.from_file_or_env(path)
    value = path.read_text().strip()
    assert len(value) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert key.accepts(f"Bearer {value}") and key.accepts(f"bearer  {value} ")
    assert BearerKey.from_file_or_env(path).accepts(f"Bearer {value}")  # an existing file is kept


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer wrong", "Basic c2VjcmV0", "secret", "Bearer secret2"])
def test_anything_but_the_bearer_key_is_refused(tmp_path: Path, header: str | None):
    path = tmp_path / "key.txt"
    path.write_text("secret\n")
    assert not BearerKey(path=path).accepts(header)


def test_a_rewritten_file_is_the_new_key(tmp_path: Path):
    path = tmp_path / "key.txt"
    path.write_text("first-key\n")
    key = BearerKey(path=path)
    assert key.accepts("Bearer first-key")
    replacement = tmp_path / "key.new"
    replacement.write_text("second-key\n")
    os.replace(replacement, path)  # the documented rotation: write beside it, rename over it
    assert key.accepts("Bearer second-key")
    assert not key.accepts("Bearer first-key")


def test_a_file_caught_mid_write_keeps_the_last_key(tmp_path: Path):
    path = tmp_path / "key.txt"
    path.write_text("first-key\n")
    key = BearerKey(path=path)
    path.write_text("")  # truncated, not written yet
    assert key.accepts("Bearer first-key")
    path.unlink()  # gone for a moment
    assert key.accepts("Bearer first-key")
    path.write_text("second-key")
    assert key.accepts("Bearer second-key")


def test_the_key_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(KEY_ENV, "env-key")
    key = BearerKey.from_file_or_env(None)
    assert key.accepts("Bearer env-key") and not key.accepts("Bearer other")
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(ValueError, match=KEY_ENV):
        BearerKey.from_file_or_env(None)
    with pytest.raises(ValueError, match="empty"):
        BearerKey(value="  ")
