"""The worker's handle on one replica process: start it, talk to it, see it end.

The replica is a fresh interpreter (`python -m handler.replicas.child`), not a fork: a forked
child would inherit the worker's threads and whatever the worker imported, and the Neuron
runtime reads NEURON_RT_VISIBLE_CORES once, at import. Its environment is the worker's plus
its own NEURON_RT_VISIBLE_CORES and the worker's import path. Messages are pickled over a
socket pair; one reader thread per replica hands them to the replica set, and reports the
exit (EOF on the socket, then the exit status) within milliseconds of a kill -9.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

from handler.neuron.cores import VISIBLE_CORES_ENV, format_core_list
from handler.neuron.environment import child_environment
from handler.replicas.protocol import ReplicaSpec, Stop

logger = logging.getLogger(__name__)


def describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


class ReplicaProcess:
    """One started replica process. `on_message(process, message)` and `on_exit(process, how)`
    are called from its reader thread; `on_exit` once, after the last message."""

    def __init__(
        self,
        spec: ReplicaSpec,
        on_message: Callable[[ReplicaProcess, object], None],
        on_exit: Callable[[ReplicaProcess, str], None],
    ) -> None:
        self.spec = spec
        self._on_message = on_message
        self._on_exit = on_exit
        self._send_lock = threading.Lock()
        ours, theirs = socket.socketpair()
        env = child_environment({} if spec.cores is None else {VISIBLE_CORES_ENV: format_core_list(spec.cores)})
        try:
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "handler.replicas.child", str(theirs.fileno()), str(os.getpid())],
                pass_fds=(theirs.fileno(),),
                env=env,
            )
        finally:
            theirs.close()  # the child holds its end: EOF here once it exits
        self.pid = self.popen.pid
        self.conn = Connection(ours.detach())
        self.send(spec)
        self._reader = threading.Thread(target=self._read, name=f"replica-{spec.index}-reader", daemon=True)
        self._reader.start()

    def send(self, message: object) -> bool:
        """False when the replica is gone (its reader reports the exit)."""
        try:
            with self._send_lock:
                self.conn.send(message)
            return True
        except OSError:
            return False

    def _read(self) -> None:
        while True:
            try:
                message = self.conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._on_message(self, message)
            except Exception:
                logger.exception("replica %d: handling a message failed", self.spec.index)
        self.conn.close()
        self._on_exit(self, describe_exit(self.popen.wait()))

    def kill(self) -> None:
        try:
            self.popen.kill()
        except OSError:
            pass

    def stop(self, timeout_s: float) -> None:
        """Ask it to stop; kill it if it has not within `timeout_s`."""
        self.send(Stop())
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            logger.warning(
                "replica %d (pid %d) did not stop within %.0f s; killing it", self.spec.index, self.pid, timeout_s
            )
            self.kill()
            self.popen.wait()
