"""`PendingConstraint.wait`: the static mode's prepare thread blocks in it while a constraint
compiles. A compile that outlasts one poll must be waited for on every Python we support: on 3.10
`Future.result(timeout)` raises concurrent.futures.TimeoutError, not the builtin, and an escaped
exception kills TorchServe's micro-batching thread (the request then hangs until its timeout)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future

from handler.grammar import compiler
from handler.grammar.compiler import PendingConstraint, _Start


def _pending(timeout_s: float) -> tuple[PendingConstraint, Future]:
    future: Future = Future()
    return PendingConstraint(future, timeout_s, _Start(at=time.monotonic())), future


def test_a_compile_longer_than_a_poll_is_waited_for():
    pending, future = _pending(timeout_s=5.0)
    threading.Timer(4 * compiler.WAIT_POLL_S, future.set_result, args=(None,)).start()
    pending.wait()
    assert future.done() and pending.problem() is None


def test_a_compile_past_its_budget_ends_the_wait_with_a_reason():
    pending, future = _pending(timeout_s=3 * compiler.WAIT_POLL_S)
    pending.wait()  # never completed: the budget ends the wait
    assert not future.done()
    assert "time budget" in (pending.problem() or "")


def test_a_compile_cancelled_at_close_is_a_reason_not_an_exception():
    pending, future = _pending(timeout_s=5.0)
    future.cancel()
    pending.wait()
    assert "stopping" in (pending.problem() or "")
