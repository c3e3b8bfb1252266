"""Wire protocols, chosen per request by the path after `/predictions/<model>/<version>/`.

''                      native NDJSON, or OpenAI for an OpenAI-shaped body (below)
'v1/completions'        OpenAI completions (SSE when streaming)
'v1/chat/completions'   OpenAI chat completions
'v1/models[/<id>]'      OpenAI model listing, answered without generating
'generate'              TGI (huggingface_hub InferenceClient.text_generation): the body's `stream`
                        decides, SSE or one JSON object
'generate_stream'       TGI, always SSE

Without a path (`/predictions/<model>`, `/invocations`, and every route on TorchServe 0.11,
whose frontend does not pass `url_path`), an OpenAI-shaped JSON body is served as OpenAI,
as SageMaker's LLM containers do: `messages` -> chat completions, `model` with `prompt` ->
completions. Native bodies (`prompt` without `model`, `inputs`, plain text) stay native,
except that with `handler.no_route_api: tgi` an `inputs` body is answered in TGI's format
(non-streamed as a one-element list, like TGI's `POST /` and SageMaker's HF LLM containers).

Every Api keeps per-request wire state (id, first chunk sent, logprob tokens and text sent),
so each request gets a fresh instance.
"""

from __future__ import annotations

from typing import Any

from handler.api.base import Api
from handler.api.native import NativeApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.api.tgi import TgiApi
from handler.api.tool_parsers import DEFAULT_TOOL_PARSER
from handler.errors import NotFound

_COMPLETIONS = "v1/completions"
_CHAT = "v1/chat/completions"
_MODELS = "v1/models"
_TGI_GENERATE = "generate"
_TGI_GENERATE_STREAM = "generate_stream"


def route_path(url_path: str | None) -> str:
    """TorchServe's `url_path` header as a route ('' when the request named none)."""
    return (url_path or "").strip("/")


def select_api(
    url_path: str | None,
    model_name: str,
    body: dict[str, Any] | str | None = None,
    no_route_api: str = "native",
    tool_parser: str = DEFAULT_TOOL_PARSER,
) -> Api:
    """The Api for TorchServe's `url_path` request header; without one, for the decoded body's
    shape (and `handler.no_route_api` for an `inputs` body). `tool_parser` is the model family's
    tool-call format (`handler.tool_call_parser`)."""
    path = route_path(url_path)
    if not path:
        return _api_for_body(body, model_name, no_route_api, tool_parser)
    if path == _TGI_GENERATE:
        return TgiApi()
    if path == _TGI_GENERATE_STREAM:
        return TgiApi(always_stream=True)
    if path == _CHAT:
        return ChatCompletionsApi(model_name, tool_parser)
    if path == _COMPLETIONS:
        return CompletionsApi(model_name)
    if path == _MODELS:
        return ModelsApi(model_name)
    if path.startswith(_MODELS + "/"):
        return ModelsApi(model_name, path[len(_MODELS) + 1 :])
    raise NotFound(f"unknown route '{path}'", "url_path")


def _api_for_body(body: dict[str, Any] | str | None, model_name: str, no_route_api: str, tool_parser: str) -> Api:
    if isinstance(body, dict) and "messages" in body:
        return ChatCompletionsApi(model_name, tool_parser)
    if isinstance(body, dict) and "model" in body and "prompt" in body:
        return CompletionsApi(model_name)
    if no_route_api == "tgi" and isinstance(body, dict) and "inputs" in body:
        return TgiApi(as_list=True)
    return NativeApi()
