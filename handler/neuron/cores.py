"""Which NeuronCores this TorchServe worker may use.

N workers of one model share the cores it may use: worker k takes the k-th run of tp_degree
of them, [k * tp_degree, (k + 1) * tp_degree) of the list, through NEURON_RT_VISIBLE_CORES.
The list is every core of the host, or the operator's own NEURON_RT_VISIBLE_CORES when the
server was started with one ("run this model on cores 2-3", two models on one inf2): the
workers are partitioned within it, never outside it. The ordinal k is
TorchServe's `gpu_id` when it hands one out (config.properties `number_of_gpu`; see
docs/inferentia2.md for the one catch on inf2), else a free slot claimed with
per-core lock files that the kernel releases when a worker dies, so a restarted worker
gets its cores back.
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from handler.errors import ConfigError

logger = logging.getLogger(__name__)

CORES_PER_DEVICE = 2  # NeuronCore-v2 per Inferentia2 (and Trainium1) chip
LOCK_DIR_ENV = "INF2_NEURON_CORE_LOCK_DIR"
DEFAULT_LOCK_DIR = "/tmp/inf2-neuron-core-locks"


def neuron_devices(dev_dir: Path = Path("/dev")) -> list[Path]:
    return sorted(p for p in dev_dir.glob("neuron*") if p.name[len("neuron") :].isdigit())


def detect_cores(dev_dir: Path = Path("/dev"), sys_dir: Path = Path("/sys/class/neuron_device")) -> int:
    """NeuronCores on this host: the driver's core_count per device where it exposes it, else 2 per chip."""
    total = 0
    for device in neuron_devices(dev_dir):
        try:
            total += int((sys_dir / device.name / "core_count").read_text().strip())
        except (OSError, ValueError):
            total += CORES_PER_DEVICE
    return total


VISIBLE_CORES_ENV = "NEURON_RT_VISIBLE_CORES"


def parse_core_list(text: str) -> list[int]:
    """NEURON_RT_VISIBLE_CORES syntax: "3", "2-3", "0-1,4-5" (ranges inclusive)."""
    cores: list[int] = []
    for part in text.replace(" ", "").split(","):
        first, sep, last = part.partition("-")
        try:
            low, high = int(first), int(last if sep else first)
        except ValueError:
            raise ConfigError(f"{VISIBLE_CORES_ENV}={text!r}: expected core ids such as 2-3 or 0,1,4-5") from None
        if low < 0 or high < low:
            raise ConfigError(f"{VISIBLE_CORES_ENV}={text!r}: {part!r} is not a range of core ids")
        cores.extend(c for c in range(low, high + 1) if c not in cores)
    return cores


def format_core_list(cores: Sequence[int]) -> str:
    """The shortest NEURON_RT_VISIBLE_CORES value for these cores: "2-3", "0-1,4-5"."""
    runs: list[list[int]] = []
    for core in cores:
        if runs and core == runs[-1][-1] + 1:
            runs[-1].append(core)
        else:
            runs.append([core])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


# The operator's own NEURON_RT_VISIBLE_CORES, kept here by pin_cores (which replaces it with
# this worker's share) so a second backend in the same process partitions the same cores.
OPERATOR_CORES_ENV = "INF2_OPERATOR_VISIBLE_CORES"


def operator_cores(env: Mapping[str, str] | None = None) -> list[int] | None:
    """The cores the operator made visible to this server, or None when it set none."""
    env = os.environ if env is None else env
    value = env.get(OPERATOR_CORES_ENV, env.get(VISIBLE_CORES_ENV, "")).strip()
    return parse_core_list(value) if value else None


@dataclass
class CorePlacement:
    cores: tuple[int, ...]
    how: str
    _locks: list[IO[str]] = field(default_factory=list, repr=False)

    @property
    def first(self) -> int:
        return self.cores[0]

    @property
    def visible_cores(self) -> str:
        return format_core_list(self.cores)

    def release(self) -> None:
        for handle in self._locks:
            handle.close()
        self._locks.clear()


def check_fits(workers: int, tp_degree: int, available: int, replicas: int = 1) -> None:
    """Refuse a layout that cannot place every worker (and each worker's replicas), saying what would fit."""
    if available < 1:
        raise ConfigError(
            "backend neuronx: no Neuron device found (/dev/neuron*); run on an inf2/trn1 host, or set "
            "handler.neuronx.num_cores if the devices are mapped elsewhere"
        )
    copies = workers * replicas
    if copies * tp_degree <= available:
        return
    fits = available // tp_degree
    per_copy = available // copies
    if replicas > 1:
        what = f"{replicas} replicas" if workers == 1 else f"{workers} worker(s) x {replicas} replicas"
        options = [f"at most {fits} replicas at tp_degree {tp_degree} (scheduler.replicas)"] if fits >= 1 else []
        if per_copy >= 1:
            options.append(f"tp_degree <= {per_copy} for {replicas} replicas")
    else:
        what = f"{workers} worker(s)"
        options = [f"at most {fits} worker(s) at tp_degree {tp_degree} (minWorkers/maxWorkers)"] if fits >= 1 else []
        if per_copy >= 1:
            options.append(f"tp_degree <= {per_copy} for {workers} workers")
    raise ConfigError(
        f"backend neuronx: {what} x tp_degree {tp_degree} need {copies * tp_degree} NeuronCores but "
        f"{available} are available; use " + (" or ".join(options) or "a larger instance")
    )


def place(
    gpu_id: int | None,
    workers: int,
    tp_degree: int,
    available: int | Sequence[int],
    lock_dir: Path | None = None,
    replicas: int = 1,
) -> CorePlacement:
    """This worker's cores: slot `gpu_id` when TorchServe assigned one, else the first free slot.
    A slot is `replicas` x `tp_degree` contiguous cores (`split` shares them out).

    `available` is a core count (cores 0..n-1) or the list of core ids this model may use."""
    cores = list(range(available)) if isinstance(available, int) else list(available)
    check_fits(workers, tp_degree, len(cores), replicas)
    width = tp_degree * replicas
    slots = len(cores) // width

    def slot_cores(slot: int) -> tuple[int, ...]:
        return tuple(cores[slot * width : (slot + 1) * width])

    if gpu_id is not None:
        if not 0 <= gpu_id < slots:
            raise ConfigError(
                f"backend neuronx: TorchServe gave this worker gpu_id {gpu_id}, but {len(cores)} NeuronCores hold "
                f"only {slots} worker(s) of {replicas} x tp_degree {tp_degree}; set number_of_gpu in config.properties "
                "to "
                f"{slots} or fewer"
            )
        return CorePlacement(slot_cores(gpu_id), f"gpu_id {gpu_id} from TorchServe")
    lock_dir = lock_dir or Path(os.environ.get(LOCK_DIR_ENV, DEFAULT_LOCK_DIR))
    lock_dir.mkdir(parents=True, exist_ok=True)
    for slot in range(slots):
        handles = _try_lock(lock_dir, slot_cores(slot))
        if handles is not None:
            return CorePlacement(slot_cores(slot), f"free slot {slot} (core locks in {lock_dir})", handles)
    raise ConfigError(
        f"backend neuronx: all {slots} slot(s) of {width} NeuronCores are held by other processes "
        f"(locks in {lock_dir}); stop them or lower maxWorkers"
    )


def split(cores: Sequence[int], replicas: int, tp_degree: int) -> list[tuple[int, ...]]:
    """A worker's cores shared out among its replicas: replica k takes the k-th run of
    `tp_degree` of them."""
    if len(cores) < replicas * tp_degree:
        raise ConfigError(
            f"backend neuronx: {replicas} replicas x tp_degree {tp_degree} need {replicas * tp_degree} NeuronCores "
            f"but this worker holds {len(cores)} ({format_core_list(cores)})"
        )
    return [tuple(cores[k * tp_degree : (k + 1) * tp_degree]) for k in range(replicas)]


def claim(
    gpu_id: int | None, workers: int, tp_degree: int, num_cores: int | None, replicas: int = 1
) -> tuple[CorePlacement, str]:
    """This worker's cores within the operator's NEURON_RT_VISIBLE_CORES, else the host's
    (`num_cores`, or those detected), and where they were chosen from, for the log."""
    given = operator_cores()  # read before pin_cores replaces it in this process
    cores = given if given is not None else list(range(num_cores or detect_cores()))
    placement = place(gpu_id, workers, tp_degree, cores, replicas=replicas)
    within = (
        f"the operator's {VISIBLE_CORES_ENV}={format_core_list(given)}"
        if given is not None
        else f"the host's {len(cores)} cores"
    )
    return placement, within


def _try_lock(lock_dir: Path, cores: Sequence[int]) -> list[IO[str]] | None:
    handles: list[IO[str]] = []
    for core in cores:
        handle = open(lock_dir / f"core-{core}.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            for held in handles:
                held.close()
            return None
        handles.append(handle)
    return handles
