"""The fake Neuron SDKs and the backends started on them (tests/support/neuron.py). The nxdi
compile runs in the test's process here (`nxdi_compiles_in_process`) except in the tests marked
`compile_in_child`, which check the child itself."""

import pytest

from tests.support.neuron import (
    checkpoint,
    fake_neuronx,
    nxdi_compiles_in_process,
    one_torch_thread,
    start_backend,
    start_handler,
)

__all__ = [
    "checkpoint",
    "fake_neuronx",
    "nxdi_compiles_in_process",
    "one_torch_thread",
    "start_backend",
    "start_handler",
]


@pytest.fixture(autouse=True)
def _compile_in_process(nxdi_compiles_in_process: None) -> None:
    """Every test here compiles nxdi in process unless it asks for the child."""
