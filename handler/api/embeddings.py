"""The embedding routes (an archive with `handler.task: embed`; docs/embeddings.md).

- OpenAI `POST .../v1/embeddings`: `{"input", "model", "encoding_format", "dimensions"}` ->
  `{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model", "usage"}`;
  `encoding_format: base64` sends each vector as base64 of its little-endian float32 bytes (what
  OpenAI's client decodes with numpy). A body with `input` and no route is served the same way
  (`/predictions/<model>`, `/invocations`, every route on TorchServe 0.11).
- Feature extraction, `{"inputs": ...}` (or plain text) with no route: a JSON list of vectors, one
  per input, as the Hugging Face inference toolkit's sentence-embedding models and TEI's `/embed`
  answer on SageMaker.

`dimensions`: only the model's own size is accepted (nothing to do); any other is a 400. A
truncated vector is only meaningful for a model trained for it (Matryoshka); this server does not
know which are, so it never truncates. Inputs longer than the model's maximum are refused, not
truncated (the serving layer's 400 names `input[i]`).

One instance serves one request.
"""

from __future__ import annotations

import base64
import logging
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from handler.api.common import compact_json, extra_fields, log_ignored, served_model, validated
from handler.api.embedding_schemas import (
    EmbeddingRequest,
    EmbeddingsBody,
    parse_inputs,
    refuse_generation_fields,
)
from handler.api.openai import error_body
from handler.errors import InvalidRequest, ServingError, to_http

logger = logging.getLogger(__name__)

JSON = "application/json"


def base64_float32(vector: np.ndarray) -> str:
    """A vector as OpenAI's `encoding_format: base64` sends it: little-endian float32 bytes, base64."""
    return base64.b64encode(np.ascontiguousarray(vector, dtype="<f4").tobytes()).decode("ascii")


class EmbeddingApi(ABC):
    """What an embedding route provides: parse one body, render its vectors, render its error."""

    name: str
    content_type = JSON

    def immediate(self) -> str | None:
        """Every embedding route runs the model (the model listing is `ModelsApi`)."""
        return None

    @abstractmethod
    def parse(self, body: dict[str, Any] | str, max_inputs: int) -> EmbeddingRequest:
        """Validate the body; raise `InvalidRequest` naming the bad field."""

    @abstractmethod
    def reply(self, request: EmbeddingRequest, vectors: np.ndarray, prompt_tokens: int) -> str:
        """The whole response body: `vectors` is [inputs, dimension] float32, in input order."""

    def error(self, error: ServingError, midstream: bool = False) -> str:
        return compact_json(to_http(error).body)

    def http_status(self, error: ServingError) -> tuple[int, str]:
        http = to_http(error)
        return http.status, http.phrase


class OpenAIEmbeddingsApi(EmbeddingApi):
    name = "openai.embeddings"

    def __init__(self, model_name: str, dimension: int, named_route: bool = False) -> None:
        self.model = model_name
        self.dimension = dimension
        self.named_route = named_route  # reached by its route's name: the body's `model` must be the served one

    def parse(self, body: dict[str, Any] | str, max_inputs: int) -> EmbeddingRequest:
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object with 'input'", "body")
        refuse_generation_fields(body)
        req = validated(EmbeddingsBody, body)
        log_ignored(self.name, extra_fields(req))
        if req.dimensions is not None and req.dimensions != self.dimension:
            raise InvalidRequest(
                f"'dimensions' is {req.dimensions}; this model's embeddings have {self.dimension} dimensions and "
                "cannot be shortened (it was not trained for truncated embeddings): leave dimensions out or send "
                f"{self.dimension}",
                "dimensions",
            )
        inputs, single = parse_inputs(req.input, "input", max_inputs)
        self.model, _ = served_model(req.model, self.model, self.named_route)  # an embedding archive has no adapters
        return EmbeddingRequest(inputs, "input", single, req.encoding_format or "float", req.dimensions)

    def reply(self, request: EmbeddingRequest, vectors: np.ndarray, prompt_tokens: int) -> str:
        encode = base64_float32 if request.encoding_format == "base64" else _floats
        data = [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)]
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}
        return compact_json({"object": "list", "data": data, "model": self.model, "usage": usage})

    def error(self, error: ServingError, midstream: bool = False) -> str:
        return compact_json(error_body(error))


class FeatureExtractionApi(EmbeddingApi):
    """`{"inputs": str | [str, ...], "parameters": {...}}` or plain text -> `[[float, ...], ...]`."""

    name = "feature_extraction"

    def parse(self, body: dict[str, Any] | str, max_inputs: int) -> EmbeddingRequest:
        if isinstance(body, str):
            inputs, single = parse_inputs(body, "inputs", max_inputs)
            return EmbeddingRequest(inputs, "inputs", single)
        refuse_generation_fields(body)
        if "inputs" not in body:
            raise InvalidRequest("'inputs' is required", "inputs")
        parameters = body.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object", "parameters")
        refuse_generation_fields(parameters or {}, "parameters.")
        ignored = [k for k in body if k not in ("inputs", "parameters")]
        log_ignored(self.name, ignored + [f"parameters.{k}" for k in parameters or {}])
        inputs, single = parse_inputs(body["inputs"], "inputs", max_inputs)
        return EmbeddingRequest(inputs, "inputs", single)

    def reply(self, request: EmbeddingRequest, vectors: np.ndarray, prompt_tokens: int) -> str:
        return compact_json([_floats(v) for v in vectors])


def _floats(vector: np.ndarray) -> list[float]:
    return vector.tolist()
