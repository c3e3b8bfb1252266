"""What both TorchServe scheduling modes share: the loaded backend, and turning one TorchServe
request into a `Sequence` (or the error or reply it gets instead). The context-free work is
handler/core/preparation.py's (the ASGI frontend uses it too); this reads TorchServe's context.

Every request is answered on its own: one bad request gets its 4xx, its batch-mates
are served, and no exception escapes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from handler.api.native import NativeApi
from handler.backends.base import Backend
from handler.config import ServingConfig
from handler.core.preparation import GenerationCore, Work, choice_request, load_model
from handler.errors import EngineError, InvalidRequest, ServingError
from handler.replicas.model import ReplicatedModel
from handler.serving.grpc_jobs import is_grpc
from handler.serving.metrics import TokenMetrics, arrival_time

logger = logging.getLogger(__name__)

__all__ = ["CallWork", "GenerationService", "Work", "body_of", "choice_request", "worker_of", "workers_of"]


@dataclass
class CallWork(Work):
    """A request of a TorchServe call: the core's `Work`, plus what TorchServe's worker protocol needs."""

    index: int = 0  # its place in the call (continuous mode re-sends it at another place in later calls)
    grpc: bool = False  # came through TorchServe's gRPC API: answered whole, in one reply (serving/grpc_jobs.py)
    chunks_sent: int = 0  # static mode: streamed chunks already sent
    final_sent: bool = False  # static mode: a streamed request's closing chunk went out as soon as it finished


class GenerationService(GenerationCore):
    """The core, plus what TorchServe's worker hands over: its context, and its custom metrics."""

    def __init__(self, config: ServingConfig, backend: Backend | ReplicatedModel, model_dir: str | None = None) -> None:
        super().__init__(config, backend, model_dir)
        self.token_metrics = TokenMetrics(backend.n_slots)

    @classmethod
    def from_context(cls, context: Any) -> GenerationService:
        config = ServingConfig.from_model_yaml(context.model_yaml_config)
        model_dir = context.system_properties.get("model_dir")
        return cls(config, load_model(config, model_dir, *worker_of(context)), model_dir)

    def prepare(
        self, index: int, row: Any, context: Any, refusal: ServingError | None = None, compiled: bool = False
    ) -> CallWork:
        """Parse, validate and tokenize request `index` of a TorchServe call. The body is decoded
        once, here. `refusal` (the drain's 503) answers the request in its route's own format."""
        work = CallWork(context.get_request_id(index) or str(index), NativeApi(), index=index)
        work.arrived_at = arrival_time(context, index)
        work.one_reply = work.grpc = is_grpc(context, index, row)
        try:
            headers = _all_headers(context, index)
            url_path = context.get_request_header(index, "url_path")
            model_name = context.model_name
        except Exception as exc:  # as the core answers an unexpected failure
            logger.exception("preprocessing request %s failed", work.request_id)
            work.error = EngineError(f"preprocessing failed: {exc}")
            return work
        self.prepare_request(work, url_path, model_name, lambda: body_of(row), headers, refusal, compiled)
        return work


def _all_headers(context: Any, index: int) -> dict[str, Any] | None:
    try:
        return context.get_all_request_header(index)
    except (AttributeError, IndexError, TypeError):  # a context without headers (tests, 0.11 re-sends)
        return None


def worker_of(context: Any) -> tuple[int | None, int]:
    """(TorchServe's gpu_id for this worker or None, the model's worker count) from its context."""
    if context is None:
        return None, 1
    gpu_id = (getattr(context, "system_properties", None) or {}).get("gpu_id")
    return (int(gpu_id) if gpu_id is not None else None), workers_of(getattr(context, "model_yaml_config", None))


def workers_of(model_yaml_config: dict[str, Any] | None) -> int:
    """The model's worker count as TorchServe reads it: maxWorkers, else minWorkers, else 1."""
    raw = model_yaml_config or {}
    value = raw.get("maxWorkers", raw.get("minWorkers", 1))
    return value if isinstance(value, int) and value > 0 else 1


def body_of(row: Any) -> Any:
    """A TorchServe input row: {"body": ...} or {"data": ...} (plus e.g. model_name on /invocations)."""
    if isinstance(row, dict):
        for key in ("body", "data"):
            if row.get(key) is not None:
                return row[key]
        raise InvalidRequest("the request has no body", "body")
    return row
