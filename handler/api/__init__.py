"""Wire protocols, chosen per request by the path after `/predictions/<model>/<version>/`
(the named routes are declared once, in handler/api/routes.py):

''                      native NDJSON, or OpenAI for an OpenAI-shaped body (below)
'v1/completions'        OpenAI completions (SSE when streaming)
'v1/chat/completions'   OpenAI chat completions
'v1/models[/<id>]'      OpenAI model listing, answered without generating
'v1/responses[/<id>]'   OpenAI Responses (handler/api/responses/): a turn, or a stored response
'generate'              TGI (huggingface_hub InferenceClient.text_generation): the body's `stream`
                        decides, SSE or one JSON object
'generate_stream'       TGI, always SSE

Without a path (`/predictions/<model>`, `/invocations`, and every route on TorchServe 0.11,
whose frontend does not pass `url_path`), an OpenAI-shaped JSON body is served as OpenAI,
as SageMaker's LLM containers do: `messages` -> chat completions, `model` with `prompt` ->
completions. Native bodies (`prompt` without `model`, `inputs`, plain text) stay native,
except that with `handler.no_route_api: tgi` an `inputs` body is answered in TGI's format
(non-streamed as a one-element list, like TGI's `POST /` and SageMaker's HF LLM containers).

An archive with `handler.task: embed` answers with `select_embedding_api` instead:
'v1/embeddings' (OpenAI), 'v1/models', and without a route an `input` body as OpenAI, an `inputs`
body (or plain text) as feature extraction (handler/api/embeddings.py). Each archive refuses the
other's routes and bodies with a 400 that says which archive serves what.

Every Api keeps per-request wire state (id, first chunk sent, logprob tokens and text sent),
so each request gets a fresh instance.
"""

from __future__ import annotations

from typing import Any

from handler.api.base import Api
from handler.api.embedding_schemas import GENERATION_FIELDS, SERVES_EMBEDDINGS
from handler.api.embeddings import EmbeddingApi, FeatureExtractionApi, OpenAIEmbeddingsApi
from handler.api.native import NativeApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.responses.store import ResponseStore
from handler.api.routes import ApiContext, Route, Task, match
from handler.api.tgi import TgiApi
from handler.api.tool_parsers import DEFAULT_TOOL_PARSER
from handler.errors import InvalidRequest, NotFound

SERVES_GENERATION = (
    "this archive serves text generation (handler.task: generate); embeddings are served by an archive with "
    "handler.task: embed (configs/model-config-embed.yaml, docs/embeddings.md)"
)
_SERVES: dict[Task, str] = {"generate": SERVES_GENERATION, "embed": SERVES_EMBEDDINGS}


def route_path(url_path: str | None) -> str:
    """TorchServe's `url_path` header as a route ('' when the request named none)."""
    return (url_path or "").strip("/")


def select_api(
    url_path: str | None,
    model_name: str,
    body: dict[str, Any] | str | None = None,
    no_route_api: str = "native",
    tool_parser: str = DEFAULT_TOOL_PARSER,
    responses: ResponseStore | None = None,
    method: str = "POST",
) -> Api:
    """The Api for TorchServe's `url_path` request header; without one, for the decoded body's
    shape (and `handler.no_route_api` for an `inputs` body). `tool_parser` is the model family's
    tool-call format (`handler.tool_call_parser`); `responses` the worker's stored responses;
    `method` the HTTP method where the frontend knows it."""
    path = route_path(url_path)
    if not path:
        return _api_for_body(body, model_name, no_route_api, tool_parser)
    route, model_id = _served(path, "generate")
    context = ApiContext(model_name, tool_parser=tool_parser, model_id=model_id, responses=responses, method=method)
    api = route.build(context)
    assert isinstance(api, Api), f"{route.name} answers with {type(api).__name__}"
    return api


def select_embedding_api(
    url_path: str | None, model_name: str, dimension: int, body: dict[str, Any] | str | None = None
) -> EmbeddingApi | ModelsApi:
    """The route of a request to an embedding archive; `dimension` is the model's (for `dimensions`)."""
    path = route_path(url_path)
    if path:
        route, model_id = _served(path, "embed")
        api = route.build(ApiContext(model_name, dimension=dimension, model_id=model_id))
        assert isinstance(api, EmbeddingApi | ModelsApi), f"{route.name} answers with {type(api).__name__}"
        return api
    if isinstance(body, dict) and "input" in body:
        return OpenAIEmbeddingsApi(model_name, dimension)
    if isinstance(body, str) or (isinstance(body, dict) and "inputs" in body):
        return FeatureExtractionApi()
    generation = sorted(GENERATION_FIELDS & set(body or {}))
    if generation:
        raise InvalidRequest(f"'{generation[0]}' is a text-generation field: {SERVES_EMBEDDINGS}", generation[0])
    raise InvalidRequest(
        "the body needs 'input' (OpenAI embeddings) or 'inputs' (feature extraction): the texts to embed", "input"
    )


def _served(path: str, task: Task) -> tuple[Route, str | None]:
    """The route `path` names and its id, if an archive of `task` serves it: a 404 for an unknown
    route, a 400 saying which archive serves it for the other task's."""
    route, model_id = match(path)
    if route is None:
        raise NotFound(f"unknown route '{path}'", "url_path")
    if task not in route.tasks:
        raise InvalidRequest(f"{path}: {_SERVES[task]}", "url_path")
    return route, model_id


def _api_for_body(body: dict[str, Any] | str | None, model_name: str, no_route_api: str, tool_parser: str) -> Api:
    if isinstance(body, dict) and "input" in body and not {"prompt", "messages", "inputs"} & set(body):
        raise InvalidRequest(f"a body with 'input' asks for embeddings: {SERVES_GENERATION}", "input")
    if isinstance(body, dict) and "messages" in body:
        return ChatCompletionsApi(model_name, tool_parser)
    if isinstance(body, dict) and "model" in body and "prompt" in body:
        return CompletionsApi(model_name)
    if no_route_api == "tgi" and isinstance(body, dict) and "inputs" in body:
        return TgiApi(as_list=True)
    return NativeApi()
