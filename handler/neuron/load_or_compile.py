"""The start-up decision every Neuron backend makes: load the saved compiled artifacts when their
manifest matches this configuration, else compile (under a host-wide lock, so that workers of one
host never compile the same model twice at once) and save them, or refuse when compiling is off.

SDK-free: the backend passes what loading and compiling mean for its SDK as two callables.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handler.errors import ConfigError
from handler.neuron import artifacts

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Recipe:
    """How one backend loads and compiles. `load` puts the saved artifacts on the cores, or
    returns None and why when they do not fit after all; `compile` compiles, loads and saves
    them (with the manifest)."""

    backend: str  # its name in messages and config keys: handler.<backend>.compile_on_start
    folder: Path  # the artifacts folder
    expected: dict[str, Any]  # the manifest this configuration needs
    load: Callable[[], tuple[Any | None, str]]
    compile: Callable[[], Any]
    compile_on_start: bool


def load_or_compile(recipe: Recipe) -> tuple[Any, str]:
    """The model on the cores, and the path taken: "load" or "compile"."""
    folder, name = recipe.folder, recipe.backend
    verdict = artifacts.check(folder, recipe.expected)
    failed: dict[str, Any] | None = None  # the manifest whose artifacts would not load
    reason, error = verdict.reason, ""
    if verdict.usable:
        logger.info("%s: %s in %s; loading", name, verdict.reason, folder)
        model, error = recipe.load()
        if model is not None:
            return model, "load"
        failed = artifacts.read_manifest(folder)
        reason = f"the manifest matches but the saved artifacts do not fit ({error})"
    if not recipe.compile_on_start:
        raise ConfigError(refusal(recipe, reason))
    if failed is None:
        logger.info("%s: %s; compiling", name, reason)
    else:
        logger.warning("%s: saved artifacts in %s do not fit (%s); recompiling", name, folder, error)
    with artifacts.compile_lock(folder):
        # another worker may have compiled while we waited for the lock
        if artifacts.check(folder, recipe.expected).usable and artifacts.read_manifest(folder) != failed:
            model, error = recipe.load()
            if model is not None:
                return model, "load"
            logger.warning("%s: saved artifacts in %s do not fit (%s); recompiling", name, folder, error)
        return recipe.compile(), "compile"


def refusal(recipe: Recipe, reason: str) -> str:
    folder, name = recipe.folder, recipe.backend
    return (
        f"backend {name}: cannot use the compiled artifacts in {folder}: {reason}. "
        f"handler.{name}.compile_on_start is false, so this worker does not compile (and writes nothing under "
        f"{folder.parent}); run `make compile` with this model-config.yaml on an inf2 host with the same Neuron "
        f"SDK and ship the artifacts, or set compile_on_start: true (with handler.{name}.compile_cache on a "
        "writable path if the model directory is read-only)"
    )
