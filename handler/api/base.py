"""What a wire protocol (native NDJSON, OpenAI SSE, ...) must provide.

The service runs every request the same way; an `Api` only parses the body into a
`GenerationRequest` and renders text, the last chunk and errors in its own format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from handler.engine.sequence import Sequence
from handler.errors import ServingError, to_http
from handler.request import AdapterChange, GenerationRequest, Limits


class Api(ABC):
    name: str
    changes_adapters = False  # a run-time LoRA route: `adapter_change` says what it changes

    @abstractmethod
    def parse(self, body: Any, limits: Limits, tokenizer: Any = None) -> GenerationRequest:
        """Validate the body; raise `InvalidRequest` naming the bad field.

        `tokenizer` (the backend's) is for routes that build the prompt themselves,
        e.g. chat messages rendered with the model's chat template.
        """

    def wire_name(self, field: str) -> str:
        """This route's name for a request field the service checks after parsing (`logprobs`,
        `prompt_logprobs`, `max_new_tokens`, `prompt`), for the 400 that names it."""
        return field

    def immediate(self, limits: Limits | None = None) -> str | None:
        """The whole response body for a route that needs no generation (a model
        listing, which names the adapters `limits` allows); None (the default) to parse the body and
        generate."""
        return None

    def adapter_change(self, body: Any) -> AdapterChange | None:
        """What a route that `changes_adapters` loads or unloads (handler/api/lora_admin.py)."""
        return None

    def answer(self, change: AdapterChange) -> str:
        """The response body once `adapter_change`'s change is applied."""
        raise NotImplementedError(f"{self.name} changes no adapter")

    @abstractmethod
    def content_type(self, request: GenerationRequest) -> str: ...

    @abstractmethod
    def chunk(self, sequence: Sequence, delta: str) -> str:
        """One streamed piece of text, framed for the wire."""

    @abstractmethod
    def final(self, sequence: Sequence) -> str:
        """Streaming: what closes the stream. Non-streaming: the whole response body."""

    def finish(self, sequence: Sequence) -> str:
        """Streaming, several outputs per request (OpenAI `n`): the chunk that ends one of them.
        Only a route that parses `n` gets here."""
        raise NotImplementedError(f"{self.name} serves one output per request")

    def close(self, sequences: list[Sequence]) -> str:
        """Several outputs: once all ended, what closes the stream, or the whole body."""
        raise NotImplementedError(f"{self.name} serves one output per request")

    @abstractmethod
    def error(self, error: ServingError, midstream: bool) -> str:
        """The error body; `midstream` when a 200 and some chunks are already on the wire."""

    def http_status(self, error: ServingError) -> tuple[int, str]:
        """The status and reason phrase of an error answered before anything was sent."""
        http = to_http(error)
        return http.status, http.phrase
