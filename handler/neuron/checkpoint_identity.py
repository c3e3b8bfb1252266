"""A checkpoint identified by its content, cheaply.

What the server loads from the compiled artifacts instead of from the checkpoint (NxD Inference's
pre-sharded weights: with `save_sharded_checkpoint`, `load_weights` reads only
`weights/tp{r}_sharded_checkpoint.safetensors`) must be tied to the checkpoint's content: a
re-exported fine-tune of the same shapes has the same file sizes, and sizes alone kept serving the
old weights. Reading 16 GB at every start is no answer either, so each weight file's SHA-256 is
recorded with its size and modification time; at the next start a file whose size and mtime are
unchanged keeps its recorded digest (a stat), and any other is hashed again (about 0.7 GiB/s on
one core here). SDK-free; imports no config.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

CHUNK = 16 * 2**20
STATS_KEY = "checkpoint_stats"  # the manifest's entry for the files' size and mtime (not compared)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def weight_files(checkpoint: Path) -> list[Path]:
    return sorted(p for p in checkpoint.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def stat_of(path: Path) -> dict[str, int]:
    info = path.stat()
    return {"size": info.st_size, "mtime_ns": info.st_mtime_ns}


def checkpoint_identity(checkpoint: Path, known: dict[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(identity, stats). `identity` is what the artifacts depend on: config.json's digest and each
    weight file's size and SHA-256; `stats` is each file's size and mtime, kept beside it. `known`
    is what a manifest recorded before ({"identity": ..., "stats": ...}): a file whose stat is
    unchanged keeps its recorded digest without being read."""
    recorded = (known or {}).get("identity", {}).get("weights", {})
    recorded_stats = (known or {}).get("stats", {})
    weights, stats = {}, {}
    hashed, started = [], time.perf_counter()
    for path in weight_files(checkpoint):
        stat = stat_of(path)
        stats[path.name] = stat
        previous = recorded.get(path.name)
        if previous is not None and recorded_stats.get(path.name) == stat and previous.get("size") == stat["size"]:
            weights[path.name] = previous
            continue
        weights[path.name] = {"size": stat["size"], "sha256": file_sha256(path)}
        hashed.append(path.name)
    if hashed:
        logger.info(
            "hashed %d weight file(s) of %s in %.1f s: %s",
            len(hashed),
            checkpoint,
            time.perf_counter() - started,
            ", ".join(hashed),
        )
    config_sha = hashlib.sha256((checkpoint / "config.json").read_bytes()).hexdigest()[:16]
    return {"config_sha256": config_sha, "weights": weights}, stats
