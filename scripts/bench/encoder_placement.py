"""One encoder copy per NeuronCore: `torch_neuronx.DataParallel` inside one worker, or one worker per
core (each pinned to its core, as configs/model-config-embed-inf2.yaml runs). Measured on the fake
torch_neuronx's device-time model (tests/fakes/torch_neuronx/_device.py: a core runs one call at a
time for (2/7 + 5/7 x batch) x seq/128 ms, calibrated on the Neuron SDK's Inf2 encoder table:
bert-base-uncased on inf2.xlarge, 1.0 ms at batch 1 and 6.0 ms at batch 8 x 128 per core), not on a
device: it compares the two placements, not absolute speed.

    python -m scripts.bench.encoder_placement [--callers 32] [--duration 2] [--cores 2]

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
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SEQ = 128


def _fake_sdk(cores: int):
    """The fake torch_neuronx with its device-time model on, seeing `cores` NeuronCores."""
    os.environ["FAKE_TORCH_NEURONX_DEVICE_TIME"] = "1"
    os.environ["FAKE_NEURON_NUM_CORES"] = str(cores)
    os.environ.pop("NEURON_RT_VISIBLE_CORES", None)
    os.environ.pop("FAKE_NEURONX_CALL_LOG", None)
    sys.path.insert(0, str(REPO / "tests" / "fakes"))
    import torch_neuronx
    from torch_neuronx import _device

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
    torch_neuronx, device = _fake_sdk(args.cores)
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
