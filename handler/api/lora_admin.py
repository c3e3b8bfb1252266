"""vLLM's run-time LoRA routes (`POST /v1/load_lora_adapter`, `/v1/unload_lora_adapter`), with its
bodies: `{"lora_name", "lora_path"}` and `{"lora_name"}`. Served only with
`handler.lora.runtime_updates: true`, behind the route's key like every inference route. The Api
only reads the body into an `AdapterChange`; the core applies it (handler/core/adapter_updates.py)
and answers with `loaded` / `unloaded`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, StrictBool, StrictStr

from handler.api.common import Lenient, compact_json, validated
from handler.api.openai import AnsweredApi
from handler.errors import InvalidRequest
from handler.lora import ADAPTER_NAME
from handler.request import AdapterChange


class LoadBody(Lenient):
    lora_name: StrictStr = Field(pattern=ADAPTER_NAME)
    lora_path: StrictStr = Field(min_length=1)
    load_inplace: StrictBool = False  # vLLM's "replace the adapter of that name": not served here


class UnloadBody(Lenient):
    lora_name: StrictStr = Field(pattern=ADAPTER_NAME)  # vLLM's `lora_int_id` is ignored


class AdapterAdminApi(AnsweredApi):
    """One of the two routes: `unload` says which. Generates nothing."""

    name = "lora.admin"
    changes_adapters = True

    def __init__(self, model_name: str, unload: bool = False) -> None:
        self.model_name = model_name
        self.unload = unload

    def adapter_change(self, body: Any) -> AdapterChange:
        if not isinstance(body, dict):
            raise InvalidRequest("the body must be a JSON object", "body")
        if self.unload:
            return AdapterChange(validated(UnloadBody, body).lora_name, None)
        load = validated(LoadBody, body)
        if load.load_inplace:
            raise InvalidRequest("load_inplace is not served: unload the adapter, then load it again", "load_inplace")
        if load.lora_name == self.model_name:
            raise InvalidRequest(f"'{load.lora_name}' is the base model's name", "lora_name")
        return AdapterChange(load.lora_name, load.lora_path)

    def answer(self, change: AdapterChange) -> str:
        """The 200 body once the change is applied."""
        status = "unloaded" if change.path is None else "loaded"
        return compact_json({"object": "lora_adapter", "id": change.name, "parent": self.model_name, "status": status})
