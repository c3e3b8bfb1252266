"""A replica process: `python -m handler.replicas.child FD WORKER_PID`, started by its worker
(handler/replicas/process.py) with the socket FD to talk over and, on neuronx, its
NEURON_RT_VISIBLE_CORES already in the environment.

It loads one model copy (the artifacts the worker's first replica compiled or found), warms it
up, says `Ready`, then runs a `StepEngine` on its own thread: every `Submit` becomes a
`Sequence` in it, and after every step the engine's `on_step` reports each sequence's
`Progress` to the worker. It exits when the worker says `Stop` or goes away (the socket closes, or
the worker's pid is no longer its parent's).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from concurrent.futures import Future
from multiprocessing.connection import Connection
from pathlib import Path

from handler.backends.base import Backend
from handler.backends.loader import load_backend
from handler.engine.sequence import Sequence
from handler.engine.speculation import Speculator
from handler.engine.step_engine import StepEngine
from handler.grammar import matchers
from handler.replicas.protocol import (
    FIELD_ASKS,
    LOGPROB_ASKS,
    Abort,
    AdapterLoaded,
    LoadAdapter,
    ModelFacts,
    Ready,
    ReplicaSpec,
    StartFailed,
    Stepped,
    Stop,
    Submit,
    UnloadAdapter,
)

logger = logging.getLogger(__name__)
MAX_CAUSE_CHARS = 2000


def facts_of(backend: Backend) -> ModelFacts:
    return ModelFacts(
        backend.name,
        backend.n_slots,
        backend.n_positions,
        backend.max_prompt_tokens,
        backend.vocab_size,
        frozenset(backend.eos_token_ids),
        {ask: backend.logprobs_refusal(*ask) for ask in LOGPROB_ASKS},
        getattr(backend, "device_sampling_topk", None),
        {name: backend.request_refusal(probe) for name, (probe, _) in FIELD_ASKS.items()},
        {unload: backend.runtime_adapter_refusal(unload) for unload in (False, True)},
    )


class Replica:
    """One model copy's step loop, reporting to the worker over `conn`."""

    def __init__(
        self,
        backend: Backend,
        prefill_token_budget: int,
        conn: Connection,
        max_adapters: int | None = None,
        speculator: Speculator | None = None,
    ) -> None:
        self.backend = backend
        self.conn = conn
        self.engine = StepEngine(backend, prefill_token_budget, max_adapters=max_adapters, speculator=speculator)
        self.engine.on_step = self._report
        self._lock = threading.Lock()  # guards _reported and the sending side of conn
        self._reported: dict[str, tuple[Sequence, int]] = {}  # request id: its sequence, tokens reported

    def ready(self, facts: ModelFacts, load_s: float) -> None:
        with self._lock:
            self.conn.send(Ready(facts, os.getpid(), load_s))

    def serve(self) -> None:
        """Take the worker's messages until it says Stop or goes away."""
        self.engine.start()
        try:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError):
                    logger.info("the worker went away; stopping")
                    return
                if isinstance(message, Stop):
                    return
                self._take(message)
        finally:
            self.engine.stop()
            self.backend.close()

    def _take(self, message: object) -> None:
        if isinstance(message, Submit):
            sequence = Sequence(
                message.request,
                list(message.prompt_ids),
                self.backend.tokenizer,
                self.backend.eos_token_ids,
                message.request_id,
                received_at=message.received_at,
            )
            with self._lock:
                self._reported[message.request_id] = (sequence, 0)
            self.engine.submit(sequence)
        elif isinstance(message, Abort):
            with self._lock:
                self._reported.pop(message.request_id, None)
            self.engine.abort(message.request_id)
        elif isinstance(message, LoadAdapter):
            name = message.name
            loading = self.engine.load_adapter(name, Path(message.path), message.max_rank)
            loading.add_done_callback(lambda done: self._send(AdapterLoaded(name, _failure(done))))
        elif isinstance(message, UnloadAdapter):
            self.engine.unload_adapter(message.name)
        else:
            logger.error("unknown message from the worker: %r", message)

    def _report(self) -> None:
        """After a step: what each sequence did since its last report (the engine's thread)."""
        with self._lock:
            progress = []
            for request_id, update in self.engine.take(list(self._reported)).items():
                sequence, reported = self._reported[request_id]
                progress.append(sequence.progress_since(reported))
                if update.ended:
                    del self._reported[request_id]
                else:
                    self._reported[request_id] = (sequence, len(sequence.token_ids))
            message = Stepped(
                tuple(progress), tuple(self.engine.take_records()), self.engine.occupied, self.engine.waiting
            )
            self._send_locked(message)

    def _send(self, message: object) -> None:
        with self._lock:
            self._send_locked(message)

    def _send_locked(self, message: object) -> None:
        try:
            self.conn.send(message)
        except OSError:  # the worker is gone; serve() sees it too and stops
            logger.info("could not send %s: the worker went away", type(message).__name__)


def _failure(done: Future[None]) -> str | None:
    """What a finished load raised, as the worker reports it; None when it succeeded."""
    exc = done.exception()
    return None if exc is None else str(exc)[:MAX_CAUSE_CHARS]


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_CAUSE_CHARS else text[:MAX_CAUSE_CHARS] + "..."


def run(conn: Connection) -> int:
    spec: ReplicaSpec = conn.recv()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stdout,
        format=f"replica {spec.index} (pid %(process)d) %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    started = time.perf_counter()
    try:
        matchers.configure(spec.config.grammar_cache_bytes)
        backend = load_backend(spec.config, spec.model_dir, cores=spec.cores)
        backend.warmup()
    except BaseException as exc:
        logger.exception("replica %d failed to start", spec.index)
        conn.send(StartFailed(describe(exc)))
        return 1
    replica = Replica(
        backend,
        spec.config.scheduler.prefill_token_budget,
        conn,
        spec.config.max_adapters,
        Speculator.of(spec.config.scheduler.speculation),
    )
    load_s = time.perf_counter() - started
    logger.info("replica %d ready in %.1f s", spec.index, load_s)
    replica.ready(facts_of(backend), load_s)
    replica.serve()
    return 0


def die_with_the_worker(worker_pid: int, poll_s: float = 0.5) -> None:
    """Exit when the worker process goes away. The socket's EOF says the same, but only once the step
    loop reads it: a replica still loading its model (seconds, more on a busy host) would outlive a
    worker killed meanwhile. (Not PR_SET_PDEATHSIG: it fires when the *thread* that started us
    ends, and replicas are started from threads that do, e.g. the ASGI frontend's loading thread.)"""

    def watch() -> None:
        while os.getppid() == worker_pid:
            time.sleep(poll_s)
        os._exit(0)  # reparented: the worker died (before we got here, too)

    threading.Thread(target=watch, name="worker-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    """argv: the socket's FD, then the worker's pid (the parent we must not outlive)."""
    die_with_the_worker(int(argv[2]))
    conn = Connection(int(argv[1]))
    try:
        return run(conn)
    except (EOFError, OSError):  # the worker went away before or while we started
        return 0
    finally:
        sys.stdout.flush()


if __name__ == "__main__":
    os._exit(main(sys.argv))
