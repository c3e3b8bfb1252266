"""A worker whose initialize() failed: answer every request at once, then restart.

Why not let the exception out of initialize(): TorchServe then kills the worker and starts
another after a back-off, and meanwhile queues every request for the model (0.11 and 0.12:
ModelManager.addJob only refuses a model with no worker at all), so clients hang until
they give up. The frontend has no hook that answers queued requests, so the worker does it:
initialize() returns (TorchServe marks the worker loaded and routes requests to it) in a
failed state that, for a hold time, answers every request with a 503 JSON naming the cause,
and writes `failed-<pid>.json` into the state dir so the /ping plugin says 503 "Unhealthy"
instead of 200 (the worker counts as loaded). After the hold it removes the marker and exits
the process; TorchServe restarts the worker, which tries to load the model again: a cause
that goes away (NeuronCores freed by a process that was still exiting) heals by itself.

The hold time is `INF2_INIT_FAILURE_HOLD_S` (seconds, default 30): how long one failed
start answers before the next try.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.api import Api, route_path, select_api
from handler.api.common import decode_body
from handler.api.native import NativeApi
from handler.errors import ModelLoadFailed, to_http
from handler.serving.grpc_jobs import end_grpc_reply, is_grpc
from handler.serving.replies import AnsweredInFull, error_reply
from handler.serving.state import failed_marker, state_dir
from handler.serving.ts_compat import ONE_SHOT_REPLIES

logger = logging.getLogger(__name__)

HOLD_ENV = "INF2_INIT_FAILURE_HOLD_S"
DEFAULT_HOLD_S = 30.0
MAX_CAUSE_CHARS = 2000
EXIT_CODE = 3


def describe(exc: BaseException) -> str:
    """`ExceptionType: message`, bounded (a validation error can be long)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_CAUSE_CHARS else text[:MAX_CAUSE_CHARS] + "..."


def hold_seconds() -> float:
    try:
        return max(0.0, float(os.environ.get(HOLD_ENV) or DEFAULT_HOLD_S))
    except ValueError:
        return DEFAULT_HOLD_S


def _no_route_api(context: Any) -> str:
    handler = (getattr(context, "model_yaml_config", None) or {}).get("handler")
    value = handler.get("no_route_api") if isinstance(handler, dict) else None
    return value if value in ("native", "tgi") else "native"


def write_marker(directory: Path, cause: str) -> Path:
    """failed-<pid>.json {"cause"}, written atomically (the plugin never reads half a file)."""
    directory.mkdir(parents=True, exist_ok=True)
    marker = failed_marker(directory)
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(json.dumps({"cause": cause}))
    tmp.replace(marker)
    return marker


class FailedServing:
    """Answers every request of every call with a 503 `model_load_failed` error, in the
    reply shape TorchServe's batching mode expects, until the hold ends and the process exits."""

    def __init__(
        self, cause: str, hold_s: float, marker: Path | None, exit_process: Callable[[int], Any] = os._exit
    ) -> None:
        self.cause = cause
        self.marker = marker
        self.error = ModelLoadFailed(f"the model failed to load on this worker: {cause}", None)
        self.restart_at = time.monotonic() + hold_s
        self._exit_process = exit_process
        self._lock = threading.Lock()  # the exit waits for a call being answered
        self._answered = AnsweredInFull()  # 0.11 continuous: answered in full, re-sent once more
        self._timer = threading.Timer(hold_s, self._restart)
        self._timer.daemon = True
        self._timer.start()

    @classmethod
    def start(cls, exc: BaseException, context: Any) -> FailedServing:
        """Log the failure, write the marker and enter the failed state."""
        cause = describe(exc)
        hold_s = hold_seconds()
        logger.error(
            "the model failed to load: %s. This worker answers every request with 503 for %.0f s (%s), then "
            "exits so TorchServe starts a new one",
            cause,
            hold_s,
            HOLD_ENV,
            exc_info=exc,
        )
        directory = state_dir()
        marker = None
        if directory is not None:
            try:
                marker = write_marker(directory, cause)
            except OSError:
                logger.exception("could not write the failed-start marker into %s", directory)
        return cls(cause, hold_s, marker)

    def handle(self, data: list[Any], context: Any) -> list[str]:
        with self._lock:
            try:
                if (context.model_yaml_config or {}).get("continuousBatching"):
                    return self._continuous(data, context)
                return [self._error(index, row, context) for index, row in enumerate(data)]
            except Exception:  # never let one escape: TorchServe would answer 503 without our body
                logger.exception("answering a call in the failed state failed")
                return [json.dumps(to_http(self.error).body)] * len(data)

    def _continuous(self, data: list[Any], context: Any) -> list[str]:
        """continuousBatching: each request gets one plain 503 response. On 0.12 a stopping
        criterion returning None makes it one (and ends the job); 0.11 sends a plain response
        only from a call without criteria and keeps the job, so the next call ends it with an
        empty last chunk (as handler/serving/continuous.py does)."""
        replies = [""] * len(data)
        ids: dict[int, str] = dict(context.request_ids)
        if ONE_SHOT_REPLIES:
            for index in ids:
                replies[index] = self._error(index, data[index], context)
            context.stopping_criteria = [lambda _reply: None] * len(data)
            return replies
        self._answered.keep_only(set(ids.values()))
        new = {index for index, request_id in ids.items() if request_id not in self._answered}
        if new:
            for index, request_id in ids.items():
                if index in new:
                    replies[index] = self._error(index, data[index], context)
                    self._answered.add(request_id)
                else:
                    del context.request_ids[index]  # ended in a later call
            context.stopping_criteria = None
        else:
            self._answered.clear()
            context.stopping_criteria = [lambda _reply: True] * len(data)
        return replies

    def _error(self, index: int, row: Any, context: Any) -> str:
        retry_after = max(1, round(self.restart_at - time.monotonic()))
        context.set_response_header(index, "Retry-After", str(retry_after))
        if is_grpc(context, index, row):
            end_grpc_reply(context, index)
        return error_reply(context, index, self._api(index, row, context), self.error)

    @staticmethod
    def _api(index: int, row: Any, context: Any) -> Api:
        """The request's wire format (native, OpenAI or TGI error shape), chosen as a loaded worker
        chooses it, `handler.no_route_api` included (read from the raw YAML: the config may be
        what failed); native when it cannot tell."""
        try:
            url_path = context.get_request_header(index, "url_path")
            body = None
            if not route_path(url_path):
                raw = row.get("body", row.get("data")) if isinstance(row, dict) else row
                body = decode_body(raw) if raw is not None else None
            return select_api(url_path, context.model_name, body, _no_route_api(context))
        except Exception:
            return NativeApi()

    def _restart(self) -> None:
        with self._lock:
            if self.marker is not None:
                self.marker.unlink(missing_ok=True)
            logger.error("exiting after the failed model load (%s) so that TorchServe starts a new worker", self.cause)
            for handler in logging.getLogger().handlers:
                handler.flush()
            sys.stdout.flush()
            sys.stderr.flush()
            self._exit_process(EXIT_CODE)

    def shutdown(self) -> None:
        """TorchServe is stopping the worker: no restart, and no marker left behind."""
        self._timer.cancel()
        if self.marker is not None:
            self.marker.unlink(missing_ok=True)
