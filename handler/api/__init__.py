"""Wire protocols, chosen per request by the path after `/predictions/<model>/<version>/`.

''                      native NDJSON (also `/invocations`, which carries no url_path)
'v1/completions'        OpenAI completions (SSE when streaming)
'v1/chat/completions'   OpenAI chat completions
'v1/models[/<id>]'      OpenAI model listing, answered without generating

OpenAI Apis keep per-request state (id, first chunk sent), so each request gets a
fresh instance; the stateless native Api is shared.
"""

from __future__ import annotations

from handler.api.base import Api
from handler.api.native import NativeApi
from handler.api.openai import ChatCompletionsApi, CompletionsApi, ModelsApi
from handler.errors import NotFound

_NATIVE = NativeApi()
_GENERATION_ROUTES: dict[str, type[CompletionsApi] | type[ChatCompletionsApi]] = {
    "v1/completions": CompletionsApi,
    "v1/chat/completions": ChatCompletionsApi,
}
_MODELS = "v1/models"


def select_api(url_path: str | None, model_name: str) -> Api:
    """The Api for TorchServe's `url_path` request header ('' or None: the native route)."""
    path = (url_path or "").strip("/")
    if not path:
        return _NATIVE
    if path in _GENERATION_ROUTES:
        return _GENERATION_ROUTES[path](model_name)
    if path == _MODELS:
        return ModelsApi(model_name)
    if path.startswith(_MODELS + "/"):
        return ModelsApi(model_name, path[len(_MODELS) + 1 :])
    raise NotFound(f"unknown route '{path}'", "url_path")
