"""A replica process (handler/replicas/child.py) exits when its worker dies, even before it reads
its socket: here the socket's other end stays open (this test holds it), so no EOF comes, and the
worker is killed while the child waits for its spec, as a child still loading its model would."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
# The "worker": starts the child on one end of a socket pair whose other end its parent (this
# test) also holds, prints the child's pid, then waits to be killed.
WORKER = textwrap.dedent(
    """
    import os, subprocess, sys, time
    fd = int(sys.argv[1])
    child = subprocess.Popen(
        [sys.executable, "-m", "handler.replicas.child", str(fd), str(os.getpid())], pass_fds=(fd,)
    )
    print(child.pid, flush=True)
    time.sleep(600)
    """
)


def test_the_child_exits_within_5_s_of_its_worker_being_killed():
    ours, theirs = socket.socketpair()
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        theirs.close()
        assert worker.stdout is not None
        child = psutil.Process(int(worker.stdout.readline()))
        time.sleep(0.5)  # the child is up (or still importing), blocked reading its spec (no EOF: `ours` is open)
        assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        killed_at = time.monotonic()
        child.wait(timeout=5)  # psutil.TimeoutExpired: the child outlived its worker
        print(f"\nthe child exited {time.monotonic() - killed_at:.2f} s after its worker was killed")
    finally:
        worker.kill()
        ours.close()
