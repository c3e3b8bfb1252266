"""Mirrors what src/transformers_neuronx/compiler.py reads from the environment.

- `get_compiler_flags()`: NEURON_CC_FLAGS plus `--model-type=transformer` and
  `--auto-cast=none` where the user gave no value for them.
- NEFF reuse: with NEURONX_DUMP_TO set, `<dump>/<module>/<module>.pb.neff` is reused if
  present; else libneuronxla's persistent cache, whose location `CacheUrl.get_cache_url()`
  takes from `--cache_dir=` in NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL, then
  /var/tmp/neuron-compile-cache. (The real module imports CacheUrl and
  create_compile_cache from libneuronxla.neuron_cc_cache; `NEURONX_CACHE` is not read.)
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from neuronxcc import __version__ as compiler_version

DEFAULT_CACHE_URL = "/var/tmp/neuron-compile-cache"


def get_compiler_flags() -> str:
    user_flags = os.environ.get("NEURON_CC_FLAGS", "").strip()
    flags = [user_flags] if user_flags else []
    for key, value in {"--model-type": "transformer", "--auto-cast": "none"}.items():
        if key not in user_flags:
            flags.append(f"{key}={value}")
    return " ".join(flags)


class CacheUrl:
    """Stand-in for libneuronxla.neuron_cc_cache.CacheUrl."""

    @staticmethod
    def get_cache_url() -> str:
        for flag in shlex.split(os.environ.get("NEURON_CC_FLAGS", "")):
            if flag.startswith("--cache_dir="):
                return flag.split("=", 1)[1]
        return os.environ.get("NEURON_COMPILE_CACHE_URL") or DEFAULT_CACHE_URL


class LocalCompileCache:
    def __init__(self, url: str) -> None:
        self.url = url

    def path(self, module_hash: str) -> Path | None:
        if self.url.startswith("s3://"):
            return None  # the fake keeps no S3; every lookup is a miss
        return Path(self.url) / f"neuronxcc-{compiler_version}" / f"MODULE_{module_hash}" / "model.neff"


def create_compile_cache(url: str) -> LocalCompileCache:
    return LocalCompileCache(url)


def compile_program(program_hash: str, neff: bytes) -> tuple[bytes, str]:
    """'Compile' one program: reuse a NEFF from NEURONX_DUMP_TO or the persistent cache, else
    produce it and store it there. Returns the NEFF and where it came from."""
    dump = os.environ.get("NEURONX_DUMP_TO")
    if dump is not None:
        path = Path(dump) / program_hash / f"{program_hash}.pb.neff"
        source = "dump-hit" if path.exists() else "compiled"
    else:
        found = create_compile_cache(CacheUrl.get_cache_url()).path(program_hash)
        path = found
        source = "cache-hit" if found is not None and found.exists() else "compiled"
    if source != "compiled":
        return path.read_bytes(), source
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(neff)
    return neff, source
