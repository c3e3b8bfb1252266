"""Stop a TorchServe started by `make serve` (or the tests' harness), draining it first.

1. `drain.json` (deadline = now + grace) into the state dir (handler/serving/state.py): the
   /ping plugin answers 503, the workers answer new requests 503 and let the requests in
   flight finish; at the deadline they end what is left with an in-band error.
2. Wait until every worker process of the frontend has written `drained-<pid>` (or has
   `failed-<pid>.json`: it never loaded, so it has nothing in flight), or the deadline plus
   a margin passed.
3. `torchserve --stop` (SIGTERM to the frontend); wait until the frontend has exited, and
   kill it if it has not within FRONTEND_EXIT_S.
4. Kill every worker process still alive: a frontend that dies abruptly leaves them behind.
   A worker is known by its frontend (its parent) or, once orphaned, by its Unix socket,
   which is in TorchServe's temp dir (where the pid file is).
5. Remove the drain files.

    python -m scripts.serve.stop_server --pid-file build/.model_server.pid --state-dir build/state --grace 20

Without --grace (or with 0) it stops at once, as `torchserve --stop` does, and still kills
leftover workers, also those of a frontend that was killed.

With --asgi-pid-file it first stops the ASGI frontend that `make serve FRONTEND=asgi` started
(scripts/serve/asgi_server.py: SIGTERM, which drains, then wait), so `make stop` stops whichever
frontend runs.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from handler.serving.state import DRAIN_FILE, drained_marker, failed_marker, write_drain
from scripts.serve import asgi_server

FRONTEND_CLASS = "org.pytorch.serve.ModelServer"  # in the frontend's java command line
WORKER_SCRIPT = "model_service_worker"  # ts/model_service_worker.py: one process per worker
DRAIN_MARGIN_S = 2.0  # after the deadline: the workers end what is left, then mark drained
FRONTEND_EXIT_S = 20.0
POLL_S = 0.1


@dataclass
class StopReport:
    drain_s: float | None = None  # how long the drain took; None: no drain
    undrained: list[int] = field(default_factory=list)  # workers not drained by the deadline + margin
    stop_s: float = 0.0  # from `torchserve --stop` until the frontend was gone
    frontend_killed: bool = False
    workers_killed: list[int] = field(default_factory=list)

    def summary(self) -> str:
        parts = []
        if self.drain_s is not None:
            late = f"; not drained: {self.undrained}" if self.undrained else ""
            parts.append(f"drained in {self.drain_s:.1f} s{late}")
        parts.append(f"TorchServe stopped in {self.stop_s:.1f} s" + (" (killed)" if self.frontend_killed else ""))
        if self.workers_killed:
            parts.append(f"killed leftover worker(s) {self.workers_killed}")
        return "; ".join(parts)


def frontend_process(pid_file: Path) -> psutil.Process | None:
    """The running frontend named by TorchServe's pid file (not some process that reused its pid)."""
    try:
        process = psutil.Process(int(pid_file.read_text().split()[0]))
        return process if any(FRONTEND_CLASS in part for part in process.cmdline()) else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def worker_processes(frontend: psutil.Process | None, temp_dir: Path | None = None) -> list[psutil.Process]:
    """The frontend's Python worker processes (not, e.g., its metrics collector), and with
    `temp_dir` (TorchServe's, where its pid file is) also those whose frontend is gone: a
    worker's Unix socket is in its frontend's temp dir."""
    found: dict[int, psutil.Process] = {}
    if frontend is not None:
        with contextlib.suppress(psutil.Error):
            for child in frontend.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if _is_worker(child.cmdline()):
                        found[child.pid] = child
    if temp_dir is not None:
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if _is_worker(cmdline) and _socket_dir(cmdline) == temp_dir.resolve():
                found.setdefault(process.pid, process)
    return list(found.values())


def _is_worker(cmdline: list[str]) -> bool:
    return any(WORKER_SCRIPT in part for part in cmdline)


def _socket_dir(cmdline: list[str]) -> Path | None:
    """The folder of the worker's `--sock-name` (`<temp dir>/.ts.sock.<port>`)."""
    for flag, value in itertools.pairwise(cmdline):
        if flag == "--sock-name":
            return Path(value).resolve().parent
    return None


def drain(frontend: psutil.Process, state_dir: Path, grace_s: float) -> tuple[float, list[int]]:
    """Order the drain and wait for the workers: (seconds waited, pids not drained in time)."""
    started = time.monotonic()
    order = write_drain(state_dir, grace_s)
    give_up = order.deadline_unix_s + DRAIN_MARGIN_S
    while True:
        pending = [
            w.pid
            for w in worker_processes(frontend)
            if not drained_marker(state_dir, w.pid).exists() and not failed_marker(state_dir, w.pid).exists()
        ]
        if not pending or time.time() >= give_up:
            return time.monotonic() - started, pending
        time.sleep(POLL_S)


def clear_drain(state_dir: Path) -> None:
    for path in [state_dir / DRAIN_FILE, *state_dir.glob("drained-*")]:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def kill_leftovers(workers: list[psutil.Process]) -> list[int]:
    """Kill the recorded workers that outlived their frontend; their pids."""
    alive = [w for w in workers if w.is_running()]  # is_running() also checks it is the same process
    for worker in alive:
        with contextlib.suppress(psutil.Error):
            worker.kill()
    psutil.wait_procs(alive, timeout=5)
    return [w.pid for w in alive]


def stop_torchserve(
    pid_file: Path,
    torchserve: Path | str = "torchserve",
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    state_dir: Path | None = None,
    grace_s: float | None = None,
) -> StopReport:
    """Drain (when `grace_s` and `state_dir` are given), stop, and leave no worker behind."""
    report = StopReport()
    frontend = frontend_process(pid_file)
    temp_dir = pid_file.parent  # TorchServe's temp dir: its workers' sockets are there too
    workers = {w.pid: w for w in worker_processes(frontend, temp_dir)}
    try:
        if frontend is not None and state_dir is not None and grace_s:
            report.drain_s, report.undrained = drain(frontend, state_dir, grace_s)
        workers.update((w.pid, w) for w in worker_processes(frontend, temp_dir))  # a worker restarted meanwhile
        started = time.monotonic()
        subprocess.run([str(torchserve), "--stop"], env=env, cwd=cwd, capture_output=True, check=False)
        if frontend is not None:
            _, alive = psutil.wait_procs([frontend], timeout=FRONTEND_EXIT_S)
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.kill()
                    report.frontend_killed = True
            psutil.wait_procs(alive, timeout=5)
        report.stop_s = time.monotonic() - started
        report.workers_killed = kill_leftovers(list(workers.values()))
    finally:
        if state_dir is not None:
            clear_drain(state_dir)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Drain, then stop TorchServe; no worker process is left behind")
    parser.add_argument("--pid-file", type=Path, required=True, help="TorchServe's .model_server.pid")
    parser.add_argument("--state-dir", type=Path, help="INF2_STATE_DIR of the server (no drain without it)")
    parser.add_argument("--grace", type=float, default=0.0, help="seconds the requests in flight get to finish")
    parser.add_argument("--torchserve", default="torchserve", help="the torchserve command")
    parser.add_argument("--asgi-pid-file", type=Path, help="the ASGI frontend's pid file (make serve FRONTEND=asgi)")
    args = parser.parse_args(argv)
    asgi_took = asgi_server.stop(args.asgi_pid_file, args.grace) if args.asgi_pid_file else None
    if asgi_took is not None:
        print(f"the ASGI frontend drained and stopped in {asgi_took:.1f} s")
    torchserve_running = frontend_process(args.pid_file) is not None
    if not torchserve_running and asgi_took is None:
        print("TorchServe is not running" + (" (nor the ASGI frontend)" if args.asgi_pid_file else ""))
    report = stop_torchserve(
        args.pid_file, args.torchserve, dict(os.environ), state_dir=args.state_dir, grace_s=args.grace
    )
    if torchserve_running or report.workers_killed:
        print(report.summary())


if __name__ == "__main__":
    main()
