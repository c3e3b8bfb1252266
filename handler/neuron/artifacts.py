"""Compiled artifacts saved next to the model, and the manifest that says what they fit.

transformers-neuronx's `load(dir)` does not check anything: a NEFF whose HLO hash is
missing fails inside `to_neuron()` (FileNotFoundError), and NEFFs built with other
compiler flags or another compiler load silently. So `manifest.json`, written last
beside the NEFFs, records everything they depend on and is compared before `load()`;
any difference means a clean recompile.

Layout:  <artifacts_dir>/manifest.json + what the SDK saved (neuronx: *.neff; nxdi: model.pt,
neuron_config.json, weights/), every file listed in the manifest (written to a temporary folder, then
swapped in, so a reader never sees half a set), and `<artifacts_dir>.lock`, which
serialises compiling between the workers of one host.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class Verdict:
    usable: bool
    reason: str


def read_manifest(artifacts_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((artifacts_dir / MANIFEST).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        logger.warning("unreadable %s: %s", artifacts_dir / MANIFEST, exc)
        return None


def check(artifacts_dir: Path, expected: dict[str, Any]) -> Verdict:
    """May the artifacts in `artifacts_dir` be loaded for `expected`? The reason names what differs."""
    found = read_manifest(artifacts_dir)
    if found is None:
        return Verdict(False, f"no compiled artifacts in {artifacts_dir}")
    changed = differences(found.get("depends_on", {}), expected)
    if changed:
        return Verdict(False, "manifest mismatch (" + "; ".join(changed) + ")")
    missing = [name for name in found.get("files", []) if not (artifacts_dir / name).is_file()]
    if missing or not found.get("files"):
        return Verdict(False, f"artifacts incomplete: {len(missing)} file(s) listed in the manifest are missing")
    return Verdict(True, f"manifest matches ({len(found['files'])} files)")


def differences(recorded: Any, expected: Any, path: str = "") -> list[str]:
    """Each leaf that differs, by its dotted path (`checkpoint.weights.model.safetensors.sha256`),
    so a mismatch names the file or key that changed rather than two whole dictionaries."""
    if isinstance(recorded, dict) and isinstance(expected, dict):
        out: list[str] = []
        for key in sorted(set(recorded) | set(expected), key=str):
            out += differences(recorded.get(key), expected.get(key), f"{path}.{key}" if path else str(key))
        return out
    return [] if recorded == expected else [f"{path}: {recorded!r} -> {expected!r}"]


def record_extra(artifacts_dir: Path, key: str, value: Any) -> None:
    """Replace one top-level entry of the manifest that `check` does not compare (e.g. the
    checkpoint's file stats), written whole and renamed into place."""
    manifest = read_manifest(artifacts_dir)
    if manifest is None or manifest.get(key) == value:
        return
    manifest[key] = value
    path = artifacts_dir / MANIFEST
    staging = path.with_name(f"{MANIFEST}.new-{os.getpid()}")
    try:
        staging.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        staging.rename(path)
    except OSError as exc:  # a read-only artifacts folder: the next start hashes again
        logger.info("could not update %s: %s", path, exc)
        staging.unlink(missing_ok=True)


def save(
    artifacts_dir: Path,
    expected: dict[str, Any],
    save_model: Callable[[str], None],
    extra: dict[str, Any] | None = None,
) -> None:
    """Write the artifacts with `save_model(dir)` into a fresh folder, add the manifest (with
    `extra`: top-level entries `check` does not compare), swap it in."""
    artifacts_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = artifacts_dir.with_name(f"{artifacts_dir.name}.new-{os.getpid()}")
    retired = artifacts_dir.with_name(f"{artifacts_dir.name}.old-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        save_model(str(staging))
        files = sorted(str(p.relative_to(staging)) for p in staging.rglob("*") if p.is_file())
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "depends_on": expected,
            "files": files,
            **(extra or {}),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        if artifacts_dir.exists():
            artifacts_dir.rename(retired)
        staging.rename(artifacts_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(retired, ignore_errors=True)


@contextlib.contextmanager
def compile_lock(artifacts_dir: Path) -> Iterator[None]:
    """One compiler per host and artifacts folder: the others wait, then load what it saved.
    A folder we may not write (read-only model store) is not locked."""
    path = artifacts_dir.with_name(artifacts_dir.name + ".lock")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(path, "a+")
    except OSError as exc:
        logger.warning("cannot create %s (%s); compiling without a lock", path, exc)
        yield
        return
    with handle:
        started = time.monotonic()
        fcntl.flock(handle, fcntl.LOCK_EX)
        waited = time.monotonic() - started
        if waited > 1:
            logger.info("waited %.1f s for another worker's compile lock on %s", waited, path)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
