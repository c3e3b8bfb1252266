"""torch's intra-op threads in the ASGI frontend's process.

Behind TorchServe the worker process runs the step loop and the host's sampling; the HTTP side runs
in the Java frontend. Here one process runs the event loop, the engine bridge and the step loop too,
and torch's default (one intra-op thread per core) made the host's sampling over a batch of logits
take 2-3 times as long on a 2-core host (docs/performance.md, P14: 0.74 by default, 0.99 with one
thread). So a generation model leaves one core to the rest of the process: cores - 1 threads.
OMP_NUM_THREADS in the environment, or handler.cpu_threads (the hf backend applies it), decide
instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

logger = logging.getLogger(__name__)


def intra_op_threads(cpu_threads: int | None, environ: Mapping[str, str], cores: int | None) -> int | None:
    """The thread count to set, or None to leave it to OMP_NUM_THREADS or handler.cpu_threads."""
    if "OMP_NUM_THREADS" in environ or cpu_threads is not None:
        return None
    return max(1, (cores or 1) - 1)


def leave_a_core_to_the_loop(cpu_threads: int | None) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = intra_op_threads(cpu_threads, os.environ, cores)
    if threads is None:
        return
    import torch  # here, not at import: the frontend's argument parsing needs no torch

    torch.set_num_threads(threads)
    logger.info("torch intra-op threads: %d (one core left to the event loop and the step loop)", threads)
