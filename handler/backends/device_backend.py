"""The life of a model compiled for NeuronCores, whatever it serves: what every device backend
(neuronx, nxdi, and the neuronx encoder of handler/backends/encoder_neuron.py) does around its SDK, in order:

1. place this process on its NeuronCores (`place_process`: the replica's given cores, or claimed
   here) before the SDK is imported;
2. set the Neuron environment and the compile cache (handler/neuron/environment.py);
3. `_prepare()` (the SDK's part): import the SDK, translate the configuration into its terms and
   say what the compiled artifacts depend on (the manifest's inputs);
4. load the saved artifacts when their manifest matches, else compile and save them, or refuse
   when compiling is off (handler/neuron/load_or_compile.py), with the SDK's `_load()` and
   `_compile()`;
5. `close()`: drop the model and give the cores back, also when a start fails half-way.

A base class with the SDK's three steps as hooks: every device backend runs the same sequence,
and scripts and tests read `placement`, `cache`, `path_taken` and `model` on the backend itself.
It knows nothing of slots, decoding or sampling (handler/backends/device_slots.py adds those for
the LLM backends), so a backend with another serving contract can stand on it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from handler.neuron.config import DeviceSection
from handler.neuron.cores import CorePlacement, claim
from handler.neuron.environment import CacheLocation, configure_compiler, pin_cores
from handler.neuron.load_or_compile import Recipe, load_or_compile

logger = logging.getLogger(__name__)


def package_version(distribution: str, module: Any) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return getattr(module, "__version__", None)


def compiler_version() -> str | None:
    try:
        return package_version("neuronx-cc", importlib.import_module("neuronxcc"))
    except ImportError:
        return None


def place_process(
    backend: str, tp_degree: int, num_cores: int | None, gpu_id: int | None, workers: int, cores: Sequence[int] | None
) -> CorePlacement:
    """This process's NeuronCores, pinned before the SDK is imported: `cores` when its worker gave
    a replica some (the worker holds their locks), else claimed here (handler/neuron/cores.py)."""
    if cores is not None:
        placement, within = CorePlacement(tuple(cores), "given by this replica's worker"), "the worker's cores"
    else:
        placement, within = claim(gpu_id, workers, tp_degree, num_cores)
    pin_cores(placement.visible_cores)
    logger.info(
        "%s: NeuronCores %s for this process (%s; %d worker(s) x tp_degree %d within %s)",
        backend,
        placement.visible_cores,
        placement.how,
        workers,
        tp_degree,
        within,
    )
    return placement


class DeviceBackend(ABC):
    """A model compiled for NeuronCores by one SDK. A subclass sets `name`, `settings` (its
    `handler.<name>` section), `checkpoint` and `tp_degree`, then calls `_place_and_start`."""

    name: str
    settings: DeviceSection
    checkpoint: Path
    tp_degree: int
    model: Any = None  # None before the start and after close()
    placement: CorePlacement | None = None
    cache: CacheLocation
    expected: dict[str, Any]  # the manifest's inputs for this configuration
    path_taken: str  # "load" or "compile"

    @property
    def _logger(self) -> logging.Logger:
        """The SDK module's logger: its start-up lines keep the name they have always had."""
        return logging.getLogger(type(self).__module__)

    def _place_and_start(self, gpu_id: int | None, workers: int, cores: Sequence[int] | None) -> None:
        """`cores`: the NeuronCores a replica was given by its worker, which holds their locks
        (handler/replicas/); without them the backend claims its own (handler/neuron/cores.py)."""
        self.placement = place_process(self.name, self.tp_degree, self.settings.num_cores, gpu_id, workers, cores)
        try:
            self._start()
        except BaseException:
            self.close()  # a worker that failed to start gives its cores back at once
            raise

    def _start(self) -> None:
        settings = self.settings
        self.cache = CacheLocation.resolve(settings.cache_dir, self.checkpoint, settings.compile_cache)
        self._logger.info("%s: compile cache: %s", self.name, configure_compiler(settings.compiler_flags, self.cache))
        self.expected = self._prepare()  # the SDK is imported here, after the environment is set
        self.model, self.path_taken = load_or_compile(
            Recipe(
                backend=self.name,
                folder=self.cache.artifacts_dir,
                expected=self.expected,
                load=self._load,
                compile=self._compile,
                compile_on_start=settings.compile_on_start,
            )
        )

    @abstractmethod
    def _prepare(self) -> dict[str, Any]:
        """Import the SDK and build its configuration (refusing what it cannot take, before any
        compile); what the compiled artifacts depend on, for the manifest."""

    @abstractmethod
    def _load(self) -> tuple[Any | None, str]:
        """The saved artifacts on the cores; or None and why, when they do not load after all."""

    @abstractmethod
    def _compile(self) -> Any:
        """Compile, save the artifacts with the manifest (`self.expected`), and the model on the cores."""

    def _running_model(self) -> Any:
        """The model, or a RuntimeError once the backend is closed."""
        if self.model is None:
            raise RuntimeError(f"{self.name} backend is closed")
        return self.model

    def close(self) -> None:
        self.model = None
        if self.placement is not None:
            self.placement.release()
            self.placement = None
