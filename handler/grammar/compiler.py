"""Constraints compiled on receipt, off the step thread, within a budget.

A constraint's matcher can take seconds to build (a schema with thousands of properties), and
llguidance may give up only at the end of that. Built in a step, it would pause every stream of
the worker; built on the thread that takes the frontend's calls, it would hold up every reply.
So each constrained request's matcher is built here, on a small pool (llguidance releases the
GIL while it builds, so the steps go on), within llguidance's own limits (`max_symbols`) and a
wall-clock budget. The matcher lands in the process's cache (handler/grammar/matchers.py), where
the request's prefill finds it: the step only copies it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from concurrent import futures
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from handler.grammar import matchers
from handler.grammar.grammars import llguidance_grammar
from handler.request import Constraint

logger = logging.getLogger(__name__)


@dataclass
class _Start:
    """When a thread began compiling a constraint (time.monotonic()); None while it is queued."""

    at: float | None = None


@dataclass
class PendingConstraint:
    """One request's constraint on its way through the pool. Its time budget runs from the moment a
    thread starts compiling it: a request queued behind hostile schemas waits (the queue is bounded:
    `ConstraintCompiler.busy`), it is not refused for their time."""

    future: Future[str | None]
    timeout_s: float
    start: _Start

    def problem(self) -> str | None:
        """Why the constraint cannot be enforced, None when it can. Call once `done`."""
        if not self.future.done():
            return "the constraint was not compiled within its time budget; simplify the schema or grammar"
        if self.future.cancelled():  # the compiler was closed: the worker is stopping
            return "the constraint was not compiled: the worker is stopping"
        return self.future.result()

    @property
    def done(self) -> bool:
        started = self.start.at
        return self.future.done() or (started is not None and time.monotonic() - started >= self.timeout_s)

    def wait(self) -> None:
        """Until the compile ended or ran past its budget. (`futures.wait`, not `result(timeout)`:
        before Python 3.11 the latter raises concurrent.futures.TimeoutError, not the builtin.)"""
        while not self.done:
            futures.wait([self.future], timeout=WAIT_POLL_S)


WAIT_POLL_S = 0.05


# The compile threads' nice value: on a small host a hostile schema's compile competes with the
# steps for the cores; Linux schedules each thread by its own nice value, so the steps come first.
COMPILE_NICE = 10


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICE)
    except (OSError, AttributeError):  # not Linux, or not allowed: compile at the process's priority
        logger.debug("could not lower the grammar compile thread's priority", exc_info=True)


class ConstraintCompiler:
    """Builds constraints' matchers for one tokenizer on `threads` threads; each gets `timeout_s`
    from the start of its compile. At most `max_pending` wait or run at once: more is an overload."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int | None,
        eos_token_ids: Iterable[int],
        threads: int = 2,
        timeout_s: float = 10.0,
        max_symbols: int = matchers.DEFAULT_MAX_SYMBOLS,
    ) -> None:
        self._tokenizer = tokenizer
        self._vocab_size = vocab_size  # None: the tokenizer's length, as the backends' masks take it
        self._eos = sorted(eos_token_ids)
        self.timeout_s = timeout_s
        self.max_symbols = max_symbols
        self.max_pending = 4 * threads + 4
        self._pool = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="grammar-compile", initializer=_lower_priority
        )
        self._pending: set[Future[str | None]] = set()

    @property
    def busy(self) -> bool:
        """As many constraints as allowed wait or compile: a new one is refused."""
        self._pending = {f for f in self._pending if not f.done()}
        return len(self._pending) >= self.max_pending

    def submit(self, constraint: Constraint) -> PendingConstraint:
        start = _Start()
        future = self._pool.submit(self._problem, constraint, start)
        self._pending.add(future)
        return PendingConstraint(future, self.timeout_s, start)

    def _problem(self, constraint: Constraint, start: _Start) -> str | None:
        start.at = time.monotonic()
        started = time.perf_counter()
        try:
            grammar = llguidance_grammar(constraint)
            vocab = (
                self._vocab_size if self._vocab_size is not None or self._tokenizer is None else len(self._tokenizer)
            )
            view = matchers.tokenizer_view(self._tokenizer, vocab, self._eos)
            if view is None:  # no tokenizer the grammar engine can read: check the grammar alone
                return matchers.validate(grammar, self.max_symbols)
            return matchers.probe(matchers.compiled(view, grammar, self.max_symbols), self._eos)
        except ValueError as exc:
            return matchers.error_gist(str(exc))
        except Exception as exc:  # a bug of ours or the engine's: this request's 400, the worker goes on
            logger.exception("compiling a constraint failed")
            return matchers.error_gist(str(exc))
        finally:
            elapsed = time.perf_counter() - started
            if elapsed > 1.0:
                logger.info("a constraint took %.1f s to compile", elapsed)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
