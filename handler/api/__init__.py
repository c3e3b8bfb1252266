"""Wire protocols, chosen per request by the path after `/predictions/<model>/<version>/`."""

from __future__ import annotations

from handler.api.base import Api
from handler.api.native import NativeApi
from handler.errors import NotFound

_NATIVE = NativeApi()


def select_api(url_path: str | None, model_name: str) -> Api:
    """The Api for TorchServe's `url_path` request header ('' or None: the native route)."""
    path = (url_path or "").strip("/")
    if not path:
        return _NATIVE
    raise NotFound(f"unknown route '{path}'", "url_path")
