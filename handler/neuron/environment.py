"""The process environment transformers-neuronx and the Neuron runtime read.

Set before transformers_neuronx is imported and before `to_neuron()`:
- NEURON_CC_FLAGS: the user's flags, `--model-type=transformer` and the configured extras.
- The compile cache. transformers-neuronx >= 2023-09 reuses NEFFs from NEURONX_DUMP_TO when
  that is set, else from the Neuron persistent cache, located by `--cache_dir=` in
  NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL, then /var/tmp/neuron-compile-cache
  (local path or s3:// URL). `NEURONX_CACHE=on` (the older switch) is no longer read.
  We point NEURON_COMPILE_CACHE_URL at the configured cache unless the operator already
  chose a location with higher precedence, and log which one is in effect.
- NEURON_RT_VISIBLE_CORES: this worker's NeuronCores (see cores.py).
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from handler.neuron.cores import OPERATOR_CORES_ENV, VISIBLE_CORES_ENV

logger = logging.getLogger(__name__)

DEFAULT_PERSISTENT_CACHE = "/var/tmp/neuron-compile-cache"
MODEL_TYPE_FLAG = "--model-type=transformer"
OPERATOR_FLAGS_ENV = "INF2_OPERATOR_NEURON_CC_FLAGS"


@dataclass(frozen=True)
class CacheLocation:
    """Where compiled work lives: the saved artifacts (always a local folder, only read unless
    this worker compiles) and the Neuron persistent compile cache (a folder or an s3:// URL)."""

    artifacts_dir: Path
    compile_cache_url: str

    @classmethod
    def resolve(cls, cache_dir: str, checkpoint: Path, compile_cache: str | None = None) -> CacheLocation:
        """`compile_cache` (handler.neuronx.compile_cache), when given, moves only the compile cache,
        e.g. off a read-only model directory; by default it is <cache_dir>/compile-cache."""
        if cache_dir.startswith("s3://"):
            # model.save()/load() need a local folder; S3 holds the persistent cache only
            artifacts_dir = checkpoint / "neuron_cache" / "artifacts"
            default_cache = cache_dir.rstrip("/") + "/compile-cache"
        else:
            root = Path(cache_dir) if Path(cache_dir).is_absolute() else checkpoint / cache_dir
            artifacts_dir, default_cache = root / "artifacts", str(root / "compile-cache")
        return cls(artifacts_dir, compile_cache or default_cache)


def compiler_flags(user_flags: str, extra: Sequence[str]) -> str:
    """NEURON_CC_FLAGS: what the operator set, plus --model-type=transformer and the extras (no duplicates)."""
    flags = shlex.split(user_flags)
    if not any(f.startswith("--model-type") for f in flags):
        flags.append(MODEL_TYPE_FLAG)
    for flag in extra:
        if flag not in flags:
            flags.append(flag)
    return shlex.join(flags)


def configure_compiler(
    extra_flags: Sequence[str], cache: CacheLocation, env: MutableMapping[str, str] | None = None
) -> str:
    """Set NEURON_CC_FLAGS and the compile cache; returns a sentence for the logs saying which cache is used."""
    env = os.environ if env is None else env
    # the operator's own flags, remembered the first time, so a second backend in this process
    # (tests, tools) does not inherit the first one's extras
    user_flags = env.setdefault(OPERATOR_FLAGS_ENV, env.get("NEURON_CC_FLAGS", ""))
    env["NEURON_CC_FLAGS"] = compiler_flags(user_flags, extra_flags)
    where = effective_cache(env, cache.compile_cache_url)
    if where.startswith("NEURON_COMPILE_CACHE_URL="):
        env["NEURON_COMPILE_CACHE_URL"] = cache.compile_cache_url
    if "NEURONX_CACHE" in env:
        logger.warning("NEURONX_CACHE is set but current transformers-neuronx no longer reads it; ignoring it")
    return where


def effective_cache(env: Mapping[str, str], wanted_url: str) -> str:
    """Which NEFF reuse mechanism the installed transformers-neuronx will take."""
    if env.get("NEURONX_DUMP_TO"):
        return f"NEURONX_DUMP_TO={env['NEURONX_DUMP_TO']} (set by the operator; NEFFs are reused from there)"
    for flag in shlex.split(env.get("NEURON_CC_FLAGS", "")):
        if flag.startswith("--cache_dir="):
            return f"{flag} in NEURON_CC_FLAGS (set by the operator)"
    return f"NEURON_COMPILE_CACHE_URL={wanted_url} (Neuron persistent cache)"


def child_environment(extra: Mapping[str, str], env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a Python child process this one starts (a replica, a compile): this
    process's, with its import path (the archive's `handler` and bundled dependencies) and `extra`."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out.update(extra)
    return out


def pin_cores(visible_cores: str, env: MutableMapping[str, str] | None = None) -> None:
    """Restrict this process to its NeuronCores. NEURON_RT_NUM_CORES would let the runtime
    pick any free cores, so it is removed in favour of the explicit range."""
    env = os.environ if env is None else env
    env.setdefault(OPERATOR_CORES_ENV, env.get(VISIBLE_CORES_ENV, ""))
    if env.pop("NEURON_RT_NUM_CORES", None) is not None:
        logger.info("NEURON_RT_NUM_CORES unset: NEURON_RT_VISIBLE_CORES=%s pins this worker", visible_cores)
    env[VISIBLE_CORES_ENV] = visible_cores
