"""Every named route of both archives, declared once: `select_api` / `select_embedding_api` match
TorchServe's `url_path` against it, and the ASGI frontend mounts its top-level paths from it
(handler/frontend/app.py), so a new route is one entry in `ROUTES`.

A route is named as TorchServe's `url_path` carries it (the path after
`/predictions/<model>/<version>/`); `paths` are the ASGI frontend's own top-level paths for it.
A route `with_id` also matches `<name>/<id>` (OpenAI's `/v1/models/<id>`); its ASGI paths hold
`{model_id:path}` for the id.

The routes without a name (`/predictions/<model>`, `/invocations`: the body's shape picks the
wire format) are not here: handler/api/__init__.py decides those.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from handler.api.base import Api
from handler.api.embeddings import EmbeddingApi, OpenAIEmbeddingsApi
from handler.api.lora_admin import AdapterAdminApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.responses.api import ResponsesApi
from handler.api.responses.store import ResponseStore
from handler.api.tgi import TgiApi
from handler.api.tool_parsers import DEFAULT_TOOL_PARSER

Task = Literal["generate", "embed"]
GENERATE: frozenset[Task] = frozenset({"generate"})
EMBED: frozenset[Task] = frozenset({"embed"})
ID_PARAM = "model_id"  # the ASGI path parameter of a `with_id` route's id
# A route that takes a `model` in its body: reached by its name, the body must name the served model
# (handler/api/common.py, served_model); the same body routed by its shape is served whatever it names.
NAMED = {"named_route": True}


@dataclass(frozen=True)
class ApiContext:
    """What an Api's constructor may take besides its route's own options."""

    model_name: str
    tool_parser: str = DEFAULT_TOOL_PARSER  # the model family's tool-call format (handler.tool_call_parser)
    dimension: int = 0  # an embedding model's output size
    model_id: str | None = None  # a `with_id` route's id (`v1/models/<id>`, `v1/responses/<id>`)
    responses: ResponseStore | None = None  # the worker's stored responses (v1/responses)
    method: str = "POST"  # the HTTP method, where the frontend knows it (TorchServe's handler does not)


@dataclass(frozen=True, eq=False)
class Route:
    """One named route: where it is served, how it is called, and the Api that answers it."""

    name: str  # TorchServe's url_path (after /predictions/<model>/<version>/), stripped of slashes
    paths: tuple[str, ...]  # the ASGI frontend's top-level paths
    api: type[Api] | type[EmbeddingApi]
    takes: tuple[str, ...] = ()  # the ApiContext fields the Api's constructor takes, in order
    options: Mapping[str, Any] = field(default_factory=dict)  # its constructor's keyword arguments
    methods: tuple[str, ...] = ("POST",)
    body: bool = True  # False: answered without reading a body (GET allowed)
    tasks: frozenset[Task] = GENERATE  # the archives (handler.task) that serve it
    with_id: bool = False
    generates: bool = True  # False: a route that changes or lists what is served (admin routes, v1/models)
    metric: str = ""  # the route label of the ASGI frontend's metrics; the name when empty

    @property
    def label(self) -> str:
        return self.metric or self.name

    def build(self, context: ApiContext) -> Api | EmbeddingApi:
        """A fresh Api for one request (each keeps per-request wire state)."""
        return self.api(*(getattr(context, name) for name in self.takes), **self.options)

    def url_path(self, model_id: str | None = None) -> str:
        """The url_path TorchServe would pass for this route (with the id of a `with_id` route)."""
        return f"{self.name}/{model_id}" if model_id else self.name


ROUTES: tuple[Route, ...] = (
    Route("v1/completions", ("/v1/completions",), CompletionsApi, takes=("model_name",), options=NAMED),
    Route(
        "v1/chat/completions",
        ("/v1/chat/completions",),
        ChatCompletionsApi,
        takes=("model_name", "tool_parser"),
        options=NAMED,
    ),
    Route(
        "v1/responses",
        ("/v1/responses", f"/v1/responses/{{{ID_PARAM}:path}}"),
        ResponsesApi,
        takes=("model_name", "responses", "tool_parser", "model_id", "method"),
        methods=("POST", "GET", "DELETE"),  # GET and DELETE with an id: a stored response
        with_id=True,
    ),
    Route("generate", ("/generate",), TgiApi),  # the body's `stream` decides: SSE or one JSON object
    Route("generate_stream", ("/generate_stream",), TgiApi, options={"always_stream": True}),
    Route(
        "v1/models",
        ("/v1/models", f"/v1/models/{{{ID_PARAM}:path}}"),
        ModelsApi,
        takes=("model_name", "model_id"),
        methods=("GET", "POST"),  # POST too, as TorchServe takes it
        body=False,
        tasks=GENERATE | EMBED,
        with_id=True,
        generates=False,
    ),
    # vLLM's run-time LoRA routes: 404 unless handler.lora.runtime_updates (handler/core/adapter_updates.py)
    Route("v1/load_lora_adapter", ("/v1/load_lora_adapter",), AdapterAdminApi, takes=("model_name",), generates=False),
    Route(
        "v1/unload_lora_adapter",
        ("/v1/unload_lora_adapter",),
        AdapterAdminApi,
        takes=("model_name",),
        options={"unload": True},
        generates=False,
    ),
    Route(
        "v1/embeddings",
        ("/v1/embeddings",),
        OpenAIEmbeddingsApi,
        takes=("model_name", "dimension"),
        options=NAMED,
        tasks=EMBED,
    ),
)
BY_NAME: dict[str, Route] = {route.name: route for route in ROUTES}
assert len(BY_NAME) == len(ROUTES), "two routes share a name"


def match(path: str) -> tuple[Route | None, str | None]:
    """The route a url_path (already stripped of slashes) names, and the id of a `with_id` route;
    (None, None) for an unknown one."""
    route = BY_NAME.get(path)
    if route is not None:
        return route, None
    parts = path.split("/")
    for cut in range(len(parts) - 1, 0, -1):  # `v1/models/<id>`, the id possibly holding slashes itself
        route = BY_NAME.get("/".join(parts[:cut]))
        if route is not None and route.with_id:
            return route, "/".join(parts[cut:])
    return None, None
