"""One encoder copy per NeuronCore: `torch_neuronx.DataParallel` inside one worker, or one worker per
core (each pinned to its core, as configs/model-config-embed-inf2.yaml runs). Measured on the fake
torch_neuronx's device-time model (tests/fakes/torch_neuronx/_device.py: a core runs one call at a
time for (2/7 + 5/7 x batch) x seq/128 ms, calibrated on the Neuron SDK's Inf2 encoder table:
bert-base-uncased on inf2.xlarge, 1.0 ms at batch 1 and 6.0 ms at batch 8 x 128 per core), not on a
device: it compares the two placements, not absolute speed.

    python -m scripts.bench.encoder_placement [--callers 32] [--duration 2] [--cores 2]

It runs itself again in a child whose PYTHONPATH starts with tests/fakes (the fake SDK), as the
tests put the fakes on the path; it edits no `sys.path`.

N callers each send a request of `batch` rows of 128 tokens and wait for its answer, again and again.
A TorchServe worker handles one request at a time (batchSize 1, the request already holds `batch`
rows), and the frontend gives each request to an idle worker:
- dataparallel: 1 worker; its module traced at batch / cores (at least 1) and wrapped in
  DataParallel over every core, which splits each request's rows across the cores;
- per-core: `cores` workers, worker k on core k with its own module traced at `batch`.
Prints rows/s and p50 latency per placement and batch, and the ratio per-core / dataparallel.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FAKES = REPO / "tests" / "fakes"
SEQ = 128


def fake_sdk_env(cores: int, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """This process's environment for a run on the fake torch_neuronx: `tests/fakes` first on
    PYTHONPATH (so `import torch_neuronx` finds the fake, as the test suites put it there), its
    device-time model on, `cores` NeuronCores visible, no call log."""
    env = {k: v for k, v in environ.items() if k not in ("NEURON_RT_VISIBLE_CORES", "FAKE_NEURONX_CALL_LOG")}
    env["PYTHONPATH"] = os.pathsep.join([str(FAKES), *filter(None, [environ.get("PYTHONPATH", "")])])
    env["FAKE_TORCH_NEURONX_DEVICE_TIME"] = "1"
    env["FAKE_NEURON_NUM_CORES"] = str(cores)
    return env


def _on_fake_sdk(cores: int) -> bool:
    """Whether this process already runs as `fake_sdk_env` sets it up (the child of `main`)."""
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return (
        bool(paths)
        and Path(paths[0]).resolve() == FAKES.resolve()
        and os.environ.get("FAKE_TORCH_NEURONX_DEVICE_TIME") == "1"
        and os.environ.get("FAKE_NEURON_NUM_CORES") == str(cores)
    )


def _fake_sdk():
    """The fake torch_neuronx (this process was started with `fake_sdk_env`)."""
    import torch_neuronx
    from torch_neuronx import _device

    if not Path(torch_neuronx.__file__).resolve().is_relative_to(FAKES.resolve()):
        raise SystemExit(f"torch_neuronx is not the fake of {FAKES}: {torch_neuronx.__file__}")
    return torch_neuronx, _device


def _rows_sum(ids, mask):
    """The traced function: trivial on the host, so the device-time model is all that costs."""
    return (ids * mask).sum(dim=1, keepdim=True)


def _traced(torch_neuronx, batch: int):
    import torch

    example = (torch.ones((batch, SEQ), dtype=torch.long), torch.ones((batch, SEQ), dtype=torch.long))
    return torch_neuronx.trace(_rows_sum, example)


def run(workers: list[Callable[..., object]], batch: int, callers: int, duration: float) -> tuple[float, float]:
    """(rows/s, p50 ms) with `callers` closed-loop callers and one thread per worker."""
    import torch

    jobs: queue.Queue[tuple[tuple, Future] | None] = queue.Queue()
    inputs = (torch.ones((batch, SEQ), dtype=torch.long), torch.ones((batch, SEQ), dtype=torch.long))

    def serve(call: Callable[..., object]) -> None:
        while (job := jobs.get()) is not None:
            args, done = job
            done.set_result(call(*args))

    latencies: list[float] = []
    lock = threading.Lock()
    deadline = time.perf_counter() + duration

    def caller() -> None:
        while time.perf_counter() < deadline:
            started, done = time.perf_counter(), Future()
            jobs.put((inputs, done))
            done.result()
            with lock:
                latencies.append(time.perf_counter() - started)

    threads = [threading.Thread(target=serve, args=(w,)) for w in workers]
    clients = [threading.Thread(target=caller) for _ in range(callers)]
    began = time.perf_counter()
    for t in threads + clients:
        t.start()
    for t in clients:
        t.join()
    elapsed = time.perf_counter() - began
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join()
    return len(latencies) * batch / elapsed, statistics.median(latencies) * 1000


def main(argv: list[str] | None = None) -> dict[tuple[str, int], tuple[float, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--callers", type=int, default=32)
    parser.add_argument("--duration", type=float, default=2.0, help="seconds per measurement")
    parser.add_argument("--cores", type=int, default=2, help="NeuronCores (inf2.xlarge: 2)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args(argv)
    if not _on_fake_sdk(args.cores):
        # The fake SDK comes from PYTHONPATH, as in the test suites: run again in a child that has it.
        command = [sys.executable, "-m", "scripts.bench.encoder_placement", *(sys.argv[1:] if argv is None else argv)]
        sys.exit(subprocess.run(command, cwd=REPO, env=fake_sdk_env(args.cores), check=False).returncode)
    torch_neuronx, device = _fake_sdk()
    import torch

    torch.set_num_threads(1)
    results: dict[tuple[str, int], tuple[float, float]] = {}
    for batch in args.batches:
        parallel = torch_neuronx.DataParallel(_traced(torch_neuronx, max(1, batch // args.cores)))
        results["dataparallel", batch] = run([parallel], batch, args.callers, args.duration)

        def on(core: int, module) -> Callable[..., object]:
            def call(*inputs):
                with device.on_core(core):
                    return module(*inputs)

            return call

        per_core = [on(core, _traced(torch_neuronx, batch)) for core in range(args.cores)]
        results["per-core", batch] = run(per_core, batch, args.callers, args.duration)
    model = {b: 1000 * b / device.device_ms(b, SEQ) for b in args.batches}
    setup = f"{args.callers} callers, {args.cores} NeuronCores, {SEQ}-token rows, {args.duration:.0f} s each"
    print(f"{setup} (the fake's device time)")
    print(f"{'placement':<14}{'batch':>6}{'rows/s':>10}{'p50 ms':>9}{'model rows/s':>14}")
    for (placement, batch), (rate, p50) in results.items():
        cores_busy = args.cores if placement == "per-core" else min(args.cores, batch)
        ideal = (
            model[batch] * args.cores
            if placement == "per-core"
            else cores_busy * 1000 * max(1, batch // args.cores) / device.device_ms(max(1, batch // args.cores), SEQ)
        )
        print(f"{placement:<14}{batch:>6}{rate:>10.0f}{p50:>9.2f}{ideal:>14.0f}")
    for batch in args.batches:
        ratio = results["per-core", batch][0] / results["dataparallel", batch][0]
        print(f"per-core / dataparallel at batch {batch}: {ratio:.2f}")
    return results


if __name__ == "__main__":
    main()
