"""Fake of torch_neuronx.utils: `get_platform_target()`, which NxD Inference's config.py uses
to pick the logical NeuronCore config (LNC 2 on trn2/trn3, else 1). The real one reads the
instance type; the fake answers `FAKE_NEURON_PLATFORM_TARGET` (default "inf2")."""

from __future__ import annotations

import os


def get_platform_target(compiler_flags: str | None = None) -> str:
    return os.environ.get("FAKE_NEURON_PLATFORM_TARGET", "inf2")
