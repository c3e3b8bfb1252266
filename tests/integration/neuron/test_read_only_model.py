"""A read-only model directory (SageMaker mounts /opt/ml/model read-only): the compile cache
can live elsewhere (`handler.neuronx.compile_cache`), and with `compile_on_start: false` a
worker only reads matching artifacts and writes nothing under the checkpoint.

The checkpoint is made read-only with chmod, but the tests may run as root, which writes
anyway; so each one also compares the checkpoint's whole tree (paths, sizes, mtimes) before
and after: a file, folder or lock file created (even if removed again) changes it."""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from handler.errors import ConfigError
from tests.support.neuron import calls, neuronx_yaml, run_alone

pytestmark = pytest.mark.usefixtures("fake_neuronx")


def tree(root: Path) -> dict[str, tuple[bool, int, int]]:
    """Every path under root (root included) -> (is a folder, size, mtime in ns)."""
    entries = {}
    for path in [root, *root.rglob("*")]:
        info = path.stat()
        entries[str(path.relative_to(root))] = (path.is_dir(), info.st_size if path.is_file() else 0, info.st_mtime_ns)
    return entries


def set_writable(root: Path, writable: bool) -> None:
    write_bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode
        path.chmod(mode | stat.S_IWUSR if writable else mode & ~write_bits)


@pytest.fixture
def read_only(checkpoint: Path) -> Iterator[Path]:
    """Makes the checkpoint read-only (chmod -R a-w) when called; writable again afterwards (for cleanup)."""
    yield checkpoint
    set_writable(checkpoint, True)


def compiled_once(checkpoint: Path, start_backend, **change) -> None:
    """What `make compile` ships: artifacts + manifest under <checkpoint>/neuron_cache (its compile
    lock file is dropped, so a worker that takes the lock again shows up as a new file)."""
    start_backend(neuronx_yaml(checkpoint, **change)).close()
    assert (checkpoint / "neuron_cache" / "artifacts" / "manifest.json").is_file()
    (checkpoint / "neuron_cache" / "artifacts.lock").unlink()


def no_compile(checkpoint: Path, **change) -> dict:
    change.setdefault("neuronx", {})["compile_on_start"] = False
    return neuronx_yaml(checkpoint, **change)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_compile_cache_key_moves_only_the_compile_cache(
    fake_neuronx, checkpoint, start_backend, tmp_path, caplog, where
):
    url = str(tmp_path / "compile-cache") if where == "local" else "s3://bucket/llama/compile-cache"
    caplog.set_level(logging.INFO)
    start_backend(neuronx_yaml(checkpoint, neuronx={"compile_cache": url}))
    [compiled] = calls(fake_neuronx, "to_neuron")
    assert compiled["mode"] == "compile" and compiled["cache_url"] == url
    assert f"compile cache: NEURON_COMPILE_CACHE_URL={url}" in caplog.text
    assert not (checkpoint / "neuron_cache" / "compile-cache").exists()
    assert (checkpoint / "neuron_cache" / "artifacts" / "manifest.json").is_file()  # artifacts stay in cache_dir
    if where == "local":
        assert len(list(Path(url).rglob("model.neff"))) == compiled["programs"]


def test_compile_on_start_false_loads_matching_artifacts_from_a_read_only_model_dir(
    fake_neuronx, read_only, start_backend
):
    compiled_once(read_only, start_backend)
    set_writable(read_only, False)
    before = tree(read_only)

    backend = start_backend(no_compile(read_only))
    tokens = run_alone(backend, backend.encode("Today the weather is"), 4)
    backend.close()

    assert len(tokens) == 4 and backend.path_taken == "load"
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron")] == ["compile", "load"]
    assert tree(read_only) == before  # no lock file, no compile cache folder, nothing


def rename_neffs(checkpoint: Path) -> None:
    """Artifacts whose manifest matches but whose NEFFs do not load (hand-edited, other release)."""
    folder = checkpoint / "neuron_cache" / "artifacts"
    manifest = json.loads((folder / "manifest.json").read_text())
    for name in manifest["files"]:
        (folder / name).rename(folder / f"x{name}")
    manifest["files"] = [f"x{name}" for name in manifest["files"]]
    (folder / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("prepare", "change", "what_differs"),
    [
        (None, {}, "no compiled artifacts in"),
        ("compile", {"n_slots": 4}, "manifest mismatch (batch_size: 2 -> 4; continuous_batching.max_num_seqs: 2 -> 4)"),
        ("compile", {"neuronx": {"context_length_estimate": [64, 256]}}, "[128, 256] -> [64, 256]"),
        ("rename", {}, "saved artifacts do not fit (Could not find a matching NEFF"),
    ],
)
def test_compile_on_start_false_fails_loudly_and_writes_nothing(
    fake_neuronx, read_only, start_backend, prepare, change, what_differs
):
    if prepare:
        compiled_once(read_only, start_backend)
    if prepare == "rename":
        rename_neffs(read_only)
    set_writable(read_only, False)
    before = tree(read_only)

    with pytest.raises(ConfigError) as info:
        start_backend(no_compile(read_only, **change))

    message = str(info.value)
    assert what_differs in message
    assert "compile_on_start is false, so this worker does not compile" in message and "make compile" in message
    assert [c["mode"] for c in calls(fake_neuronx, "to_neuron") if c["mode"] == "compile"] == (
        ["compile"] if prepare else []
    )
    assert tree(read_only) == before


def test_read_only_checks_see_a_write(checkpoint):
    """The tree comparison the tests above rely on notices a lock file, even as root."""
    before = tree(checkpoint)
    lock = checkpoint / "neuron_cache" / "artifacts.lock"
    lock.parent.mkdir()
    os.close(os.open(lock, os.O_CREAT | os.O_WRONLY))
    assert tree(checkpoint) != before
