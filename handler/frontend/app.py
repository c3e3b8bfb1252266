"""The ASGI application: the package's routes over the same wire formats as the TorchServe
archive (handler/api/), secure by default (docs/frontends.md).

Routes                                          method     wire format
/predictions/<model>[/<version>]                POST       native NDJSON, or by the body's shape
/predictions/<model>/<version>/<route>          POST, GET  the route after the version, as on TorchServe
                                                (DELETE)   (v1/responses/<id>)
/v1/completions, /v1/chat/completions           POST       OpenAI
/v1/models[/<id>]                               GET        OpenAI model listing
/v1/embeddings                                  POST       OpenAI embeddings (an embedding archive)
/generate, /generate_stream                     POST       TGI
/invocations                                    POST       by the body's shape (SageMaker)
/ping                                           GET        200 once the model serves, 503 before
/metrics                                        GET        Prometheus text

The named routes (the <route> after a version, and their top-level paths above) are mounted from
handler/api/routes.py, where each is declared once.

Every route needs `Authorization: Bearer <key>` (401 otherwise), except `/ping` and
`/invocations` in SageMaker mode (the platform authenticates its callers, and its health check
sends no key). Other methods are a 405, unknown paths a 404, a body over the limit a 413, a
body that arrives too slowly a 408: all JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from handler.api.native import NativeApi
from handler.api.routes import ID_PARAM, ROUTES, match
from handler.api.routes import Route as ApiRoute
from handler.core.preparation import Work
from handler.core.timing import arrival_from_headers
from handler.errors import InvalidRequest, Overloaded, ServingError, to_http
from handler.frontend.auth import BearerKey
from handler.frontend.body import ClientLeft, read_body, unless_disconnected
from handler.frontend.embedding import ServedEmbedder
from handler.frontend.generation import GenerationResponse
from handler.frontend.http_errors import Unauthorized, status_error
from handler.frontend.metrics import CONTENT_TYPE, FrontendMetrics
from handler.frontend.model import ServedModel
from handler.frontend.preparing import SHARE, PreparationBudget, Preparer

logger = logging.getLogger(__name__)
GET_ROUTES = tuple(route.name for route in ROUTES if "GET" in route.methods)  # GET allowed on TorchServe's paths too


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 6_553_500  # TorchServe's max_request_size default
    body_timeout_s: float = 30.0  # the whole body must arrive within this
    prepare_share: float = SHARE  # of the time that preparing requests may take (handler/frontend/preparing.py)


def json_error(error: ServingError, headers: dict[str, str] | None = None) -> JSONResponse:
    if error.retry_after_s is not None:
        headers = {**(headers or {}), "Retry-After": str(error.retry_after_s)}
    return JSONResponse(to_http(error).body, status_code=error.status, headers=headers)


class KeyCheck:
    """ASGI middleware: the bearer key on every HTTP request but the open paths, before routing
    (an unknown path without a key is a 401, not a 404: nothing is told to a caller without it)."""

    def __init__(self, app: Any, key: BearerKey | None, open_paths: frozenset[str]) -> None:
        self.app = app
        self.key = key
        self.open_paths = open_paths

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or self.key is None or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        authorization = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"authorization"), None)
        if self.key.accepts(authorization):
            await self.app(scope, receive, send)
            return
        why = "missing" if authorization is None else "wrong"
        error = Unauthorized(f"the API key is {why}: send Authorization: Bearer <key>", "Authorization")
        await json_error(error, {"WWW-Authenticate": "Bearer"})(scope, receive, send)


def build_app(
    model: ServedModel | ServedEmbedder,
    model_name: str,
    key: BearerKey | None,
    sagemaker: bool = False,
    limits: Limits = Limits(),
) -> Any:
    metrics = FrontendMetrics()
    preparer = Preparer(PreparationBudget(limits.prepare_share))

    def turned_away(metric_route: str) -> Response:
        """The in-flight bound (TorchServe's own: batchSize + jobQueueSize): a fast 503 with Retry-After."""
        error = full(model.max_in_flight)
        metrics.response(metric_route, 503)
        metrics.serving.rejected(error.reason)
        return json_error(error)

    async def embedding(request: Request, route: str, metric_route: str) -> Response:
        """An embedding archive's route: one request into the batcher (handler/frontend/embedding.py)."""
        assert isinstance(model, ServedEmbedder)
        batcher = model.batcher
        if batcher is None:
            metrics.response(metric_route, 503)
            return json_error(model.unavailable())
        if batcher.in_flight >= model.max_in_flight:
            return turned_away(metric_route)
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        request_id = uuid.uuid4().hex
        answer = await unless_disconnected(request.receive, batcher.submit(route, body, request_id))
        if answer is None:  # dropped from the batcher's queue, or its batch's answer discarded
            logger.info("request %s: the client went away before its embeddings", request_id)
            metrics.response(metric_route, 499)  # nginx's name for it: the client closed the request
            return Response(status_code=499)
        metrics.response(metric_route, answer.status)
        return Response(answer.body, status_code=answer.status, media_type="application/json")

    async def generation(request: Request, route: str, metric_route: str) -> Any:
        arrived = arrival_from_headers(request.headers)
        if request.method == "GET" and not route.startswith(GET_ROUTES):
            raise status_error(405, f"{request.url.path} takes POST")
        if isinstance(model, ServedEmbedder):
            return await embedding(request, route, metric_route)
        if not model.ready:
            metrics.response(metric_route, 503)
            return json_error(model.unavailable())
        core, bridge = model.core, model.bridge
        assert core is not None and bridge is not None
        if bridge.in_flight >= model.max_in_flight:
            return turned_away(metric_route)
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout_s)
        work = Work(uuid.uuid4().hex, NativeApi())
        work.arrived_at = arrived
        headers = dict(request.headers)

        def read() -> bytes:
            if not body:
                raise InvalidRequest("the request has no body", "body")
            return body

        work = await preparer.run(
            functools.partial(core.prepare_request, work, route, model_name, read, headers, method=request.method),
            refused=lambda prepared: prepared.error is not None,
        )
        return GenerationResponse(bridge, metrics, work, metric_route)

    def _check_model(request: Request) -> None:
        name = request.path_params["model"]
        if name != model_name:
            raise status_error(404, f"model '{name}' not found; this server serves '{model_name}'")

    async def predictions(request: Request) -> Any:
        """TorchServe's paths: the route after the version is TorchServe's url_path, as it passes it
        (an unknown one is the core's 404, as on TorchServe)."""
        _check_model(request)
        url_path = request.path_params.get("route", "")
        route, _ = match(url_path.strip("/"))
        if request.method == "DELETE" and route is None:
            raise HTTPException(405, f"{request.url.path} takes POST", headers={"Allow": "POST"})
        if route is not None and request.method not in route.methods:
            allowed = ", ".join(route.methods)
            raise HTTPException(405, f"{request.url.path} takes {allowed}", headers={"Allow": allowed})
        return await generation(request, url_path, "predictions")

    def served_at(route: ApiRoute) -> Any:
        """The endpoint of a named route's top-level paths (its methods are the Starlette route's)."""

        async def endpoint(request: Request) -> Any:
            return await generation(request, route.url_path(request.path_params.get(ID_PARAM)), route.label)

        return endpoint

    async def invocations(request: Request) -> Any:
        return await generation(request, "", "invocations")

    async def ping(request: Request) -> Response:
        status, body = model.readiness()
        return JSONResponse(body, status_code=status)

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(model.gauges(metrics)), media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = status_error(exc.status_code, None if exc.detail == _phrase(exc.status_code) else exc.detail)
        return json_error(error, dict(exc.headers or {}))

    async def serving_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ServingError)
        headers = {"Allow": "GET, POST"} if exc.status == 405 else None
        if exc.status in (408, 413):  # the rest of the body is not read: the connection cannot carry another request
            headers = {"Connection": "close"}
        return json_error(exc, headers)

    async def client_left(request: Request, exc: Exception) -> Response:
        """One line for a client that left mid-body; the 499 (nginx's name for it) reaches nobody."""
        logger.info("a client left while sending its body to %s", request.url.path[:200])
        return Response(status_code=499)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        model.start_loading(asyncio.get_running_loop())
        try:
            yield
        finally:
            if isinstance(model, ServedEmbedder):
                await model.stop()
            preparer.close()
            await asyncio.to_thread(model.close)

    routes = [
        Route("/predictions/{model}", predictions, methods=["POST"]),
        Route("/predictions/{model}/{version}", predictions, methods=["POST"]),
        Route("/predictions/{model}/{version}/{route:path}", predictions, methods=["GET", "POST", "DELETE"]),
        *(Route(path, served_at(route), methods=list(route.methods)) for route in ROUTES for path in route.paths),
        Route("/invocations", invocations, methods=["POST"]),
        Route("/ping", ping, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={HTTPException: http_error, ServingError: serving_error, ClientLeft: client_left},
        lifespan=lifespan,
    )
    app.state.model = model
    app.state.metrics = metrics
    open_paths = frozenset({"/ping", "/invocations"}) if sagemaker else frozenset()
    return KeyCheck(app, key, open_paths)


def full(max_in_flight: int) -> Overloaded:
    return Overloaded(
        f"the server is full ({max_in_flight} requests in flight: batchSize + jobQueueSize); retry shortly",
        "in_flight",
        "model",
    )


def _phrase(status: int) -> str:
    return HTTPStatus(status).phrase
