"""Turning one request into `Sequence`s (or the error or reply it gets instead), whatever
frontend it came through, and loading the model both frontends serve.

Every request is answered on its own: one bad request gets its 4xx, the others are served,
and no exception escapes.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from handler import failpoints
from handler.api import Api, route_path, select_api
from handler.api.common import decode_body
from handler.api.json_tree import printable
from handler.api.responses.store import ResponseStore
from handler.backends.base import Backend
from handler.backends.loader import load_backend
from handler.config import ServingConfig
from handler.core.adapter_updates import AdapterUpdates
from handler.core.request_checks import (
    check_body_headers,
    check_constraint_size,
    fewest_tokens,
    longest_token_chars,
)
from handler.engine.sequence import Sequence
from handler.errors import EngineError, InvalidRequest, NotFound, ServiceUnavailable, ServingError
from handler.grammar import matchers
from handler.grammar.compiler import ConstraintCompiler, PendingConstraint
from handler.replicas.model import ReplicatedModel, start_replicas
from handler.request import GenerationRequest, Limits

logger = logging.getLogger(__name__)


@dataclass
class Work:
    """One request on its way through the core, whatever frontend it came through (a frontend
    that needs more per request, such as TorchServe's call index, extends it)."""

    request_id: str
    api: Api
    sequences: list[Sequence] = field(default_factory=list)  # every output (OpenAI `n`); none when answered at once
    error: ServingError | None = None
    arrived_at: float = 0.0  # perf_counter clock; see handler/core/timing.py
    reply: str | None = None  # a route answered without generating (e.g. v1/models)
    compiling: PendingConstraint | None = None  # its constraint is being compiled: not submitted yet
    one_reply: bool = False  # its transport carries one reply, not a stream (TorchServe's gRPC): never streamed

    @property
    def sequence(self) -> Sequence | None:
        """The first (or only) output."""
        return self.sequences[0] if self.sequences else None


class GenerationCore:
    """The backend and the per-request preparation, for any frontend. The backend's tokenizer is shared by every
    thread (preprocess, the engine, the replies) without a lock: encode and decode only read it.
    Changing its truncation or padding while another thread uses it is not safe, and nothing
    here does (tests/unit/test_tokenizer_threads.py checks both)."""

    def __init__(self, config: ServingConfig, backend: Backend | ReplicatedModel, model_dir: str | None = None) -> None:
        self.config = config
        self.backend = backend
        self.model_dir = model_dir  # where relative paths point (the archive)
        # Run-time LoRA loads and unloads (handler.lora.runtime_updates): set by the engine client
        # that serves this core, which owns the engine they change.
        self.adapter_updates: AdapterUpdates | None = None
        stored = config.handler.responses
        self.responses = ResponseStore(stored.store_mb * 2**20, stored.max_age_s) if stored.store_mb else None
        handler = config.handler
        self.limits = Limits(
            handler.default_max_new_tokens,
            handler.max_new_tokens,
            handler.max_stop_strings,
            handler.max_stop_chars,
            handler.max_json_depth,
            frozenset(handler.lora.adapters if handler.lora is not None else ()),
        )
        self._longest_token_chars = longest_token_chars(backend.tokenizer)
        grammar = handler.grammar
        matchers.configure(config.grammar_cache_bytes)
        self.constraints = ConstraintCompiler(
            backend.tokenizer,
            backend.vocab_size,
            backend.eos_token_ids,
            grammar.compile_threads,
            grammar.compile_timeout_s,
            grammar.max_symbols,
        )

    def prepare_request(
        self,
        work: Work,
        url_path: str | None,
        model_name: str,
        read_body: Callable[[], Any],
        headers: Mapping[str, Any] | None,
        refusal: ServingError | None = None,
        compiled: bool = False,
        method: str = "POST",
    ) -> Work:
        """Parse, validate and tokenize one request into `work` (its id and arrival already set):
        `url_path` the route after the model ('' none: the body picks it), `read_body` returns the
        undecoded body (raising InvalidRequest when there is none), decoded once, here. `refusal`
        (a drain's 503) answers the request in its route's own format. With `compiled`, its constraint
        is compiled (or refused) before this returns; otherwise the engine client holds the request
        until it is (handler/core/engine_client.py). `method`: the HTTP method where the frontend
        knows it (the ASGI frontend; TorchServe passes none to its handler)."""
        try:
            check_body_headers(headers)
            depth = self.limits.max_json_depth
            body = None if route_path(url_path) else decode_body(read_body(), depth)  # no route: the body picks it
            handler = self.config.handler
            work.api = select_api(
                url_path, model_name, body, handler.no_route_api, handler.tool_call_parser, self.responses, method
            )
            if refusal is not None:
                raise refusal
            work.reply = work.api.immediate(self.limits)
            if work.reply is not None:
                return work
            body = decode_body(read_body(), depth) if body is None else body
            if work.api.changes_adapters:
                work.reply = self._change_adapter(work.api, body)
                return work
            request = work.api.parse(body, self.limits, self.backend.tokenizer)
            if work.one_reply and request.stream:  # the transport would drop it after its first chunk
                request = dataclasses.replace(request, stream=False)
            self._check_logprobs(request, work.api)
            self._check_sampling(request, work.api)
            self._check_output_rules(request, work.api)
            if request.prompt_token_ids is not None:
                prompt_ids = self._checked_token_ids(request.prompt_token_ids)
                if not request.prompt:  # the text an echo repeats, and what logs and stop strings see
                    text = self.backend.tokenizer.decode(prompt_ids, skip_special_tokens=True)
                    request = dataclasses.replace(request, prompt=text)
            else:  # a rendered chat template already holds its special tokens
                prompt_ids = self._encoded(request, work.api)
            self._check_length(request, len(prompt_ids), work.api)
            work.sequences = [
                Sequence(
                    choice_request(request, i),
                    list(prompt_ids),
                    self.backend.tokenizer,
                    self.backend.eos_token_ids,
                    work.request_id if i == 0 else f"{work.request_id}/{i}",
                    received_at=work.arrived_at,  # TTFT and queue wait count from receipt, before parsing
                    choice_index=i,
                    response_id=work.request_id,
                )
                for i in range(request.n)
            ]
            if request.constraint is not None:  # compiled off the step thread; submitted once it is
                work.compiling = self.constraints.submit(request.constraint)
                if compiled:  # the caller runs it at once (static micro-batches): wait for it here
                    self.settle(work, block=True)
        except ServingError as exc:
            work.error = exc
        except Exception as exc:
            logger.exception("preprocessing request %s failed", work.request_id)
            work.error = EngineError(f"preprocessing failed: {exc}")
        return work

    def settle(self, work: Work, block: bool = False) -> bool:
        """Whether the request's constraint (if any) is compiled or refused (`work.error`); with
        `block`, wait for it within its budget."""
        pending = work.compiling
        if pending is None:
            return True
        if block:
            pending.wait()
        if not pending.done:
            return False
        work.compiling = None
        problem = pending.problem()
        if problem is not None:
            param = work.api.wire_name("constraint")
            work.error = InvalidRequest(f"{param} cannot be enforced: {problem}", param)
            work.sequences = []
        return True

    def _encoded(self, request: GenerationRequest, api: Api) -> list[int]:
        """The prompt's token ids; text the tokenizer refuses is the client's 400, not our 500. A
        prompt too long to fit however it tokenizes is refused before any of it is tokenized."""
        fewest = fewest_tokens(request.prompt, self._longest_token_chars)
        if fewest > self.backend.n_positions:
            param = api.wire_name("prompt")
            raise InvalidRequest(
                f"the prompt ({len(request.prompt)} characters, more than {fewest} tokens) is longer than the "
                f"model's n_positions ({self.backend.n_positions})",
                param,
            )
        try:
            return self.backend.encode(request.prompt, add_special_tokens=request.add_special_tokens)
        except (TypeError, ValueError, UnicodeError) as exc:
            param = api.wire_name("prompt")
            raise InvalidRequest(f"'{param}' cannot be tokenized: {printable(str(exc))[:200]}", param) from None

    def _change_adapter(self, api: Api, body: Any) -> str:
        """A run-time LoRA load or unload (handler/core/adapter_updates.py), answered when applied."""
        if self.adapter_updates is None:
            raise NotFound(
                "run-time LoRA adapter updates are off here (set handler.lora.runtime_updates: true)", "url_path"
            )
        change = api.adapter_change(body)
        assert change is not None
        self.adapter_updates.apply(change)
        return api.answer(change)

    def _check_logprobs(self, request: GenerationRequest, api: Api) -> None:
        """The one place a backend's logprob capability is checked (sim has no logits; neuronx has the
        prompt's only with output_all_logits)."""
        wants, wants_prompt = request.logprobs is not None, request.prompt_logprobs
        if not (wants or wants_prompt):
            return
        refusal = self.backend.logprobs_refusal(wants, wants_prompt)
        if refusal is not None:
            param = api.wire_name("prompt_logprobs" if wants_prompt else "logprobs")
            raise InvalidRequest(f"'{param}' cannot be served: {refusal}", param)

    def _check_sampling(self, request: GenerationRequest, api: Api) -> None:
        refusal = self.backend.request_refusal(request)
        if refusal is not None:
            field, why = refusal
            param = api.wire_name(field)
            raise InvalidRequest(f"'{param}' cannot be served: {why}", param)

    def _check_output_rules(self, request: GenerationRequest, api: Api) -> None:
        """What the output may hold: token ids the request names are in the vocabulary, a constraint
        is within its size and the compile pool has room (whether it compiles is settled later), `n` > 1
        has continuous batching."""
        for field_name, ids in (
            ("logit_bias", [t for t, _ in request.sampling.logit_bias]),
            ("stop_token_ids", list(request.stop_token_ids)),
        ):
            vocab = (self.backend.vocab_size or len(self.backend.tokenizer)) if ids else 0
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                param = api.wire_name(field_name)
                raise InvalidRequest(f"{param}: token ids {bad[:5]} are outside the vocabulary (0..{vocab - 1})", param)
        if request.constraint is not None:
            param = api.wire_name("constraint")
            check_constraint_size(request.constraint, self.config.handler.grammar.max_constraint_bytes, param)
            if request.ignore_eos:
                raise InvalidRequest(
                    f"ignore_eos cannot be combined with {param}: a complete output ends with EOS", "ignore_eos"
                )
            if self.constraints.busy:
                raise ServiceUnavailable("too many constraints are being compiled; retry shortly", param)
        if request.n > 1 and self.config.scheduler.mode != "continuous":
            raise InvalidRequest("n > 1 needs scheduler.mode continuous; send n separate requests", api.wire_name("n"))
        if request.n > self.backend.n_slots:  # its outputs would run in rounds, and hold every slot meanwhile
            raise InvalidRequest(
                f"n is {request.n}; this model serves at most {self.backend.n_slots} outputs of one request at once "
                "(its slots)",
                api.wire_name("n"),
            )

    def _checked_token_ids(self, token_ids: tuple[int, ...]) -> list[int]:
        """A prompt given as token ids, used as is: no re-tokenizing, no special tokens added."""
        if not token_ids:
            raise InvalidRequest("the prompt has no token ids", "prompt")
        vocab = self.backend.vocab_size or len(self.backend.tokenizer)
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise InvalidRequest(
                f"prompt token ids {bad[:5]} are outside the model's vocabulary (0..{vocab - 1})", "prompt"
            )
        return list(token_ids)

    def _check_length(self, request: GenerationRequest, prompt_tokens: int, api: Api) -> None:
        n_positions = self.backend.n_positions
        if prompt_tokens + request.max_new_tokens > n_positions:
            param = api.wire_name("prompt" if prompt_tokens >= n_positions else "max_new_tokens")
            raise InvalidRequest(
                f"prompt ({prompt_tokens} tokens) + max_new_tokens ({request.max_new_tokens}) exceeds the model's "
                f"n_positions ({n_positions}); shorten the prompt or lower max_new_tokens",
                param,
            )
        longest = self.backend.max_prompt_tokens
        if longest is not None and prompt_tokens > longest:
            raise InvalidRequest(
                f"the prompt has {prompt_tokens} tokens; this model was compiled for prompts of at most {longest} "
                "tokens (its largest context bucket)",
                "prompt",
            )

    def close(self) -> None:
        self.constraints.close()
        self.backend.close()


def choice_request(request: GenerationRequest, index: int) -> GenerationRequest:
    """Output `index` of a request with `n` outputs: the same request, seeded with seed + index."""
    seed = request.sampling.seed
    if index == 0 or seed is None:
        return request
    return dataclasses.replace(request, sampling=dataclasses.replace(request.sampling, seed=(seed + index) % 2**63))


def load_model(
    config: ServingConfig, model_dir: str | None, gpu_id: int | None = None, workers: int = 1
) -> Backend | ReplicatedModel:
    """Load (and warm up) the model `config` names, or start its replicas; logs when it is ready."""
    failpoints.check_init()
    started = time.perf_counter()
    backend: Backend | ReplicatedModel
    if config.scheduler.replicas > 1:
        backend = start_replicas(config, model_dir, gpu_id, workers)
    else:
        backend = load_backend(config, model_dir, gpu_id, workers)
        backend.warmup()
    failpoints.delay_warmup()
    # Readiness: this line is logged just before the model serves (TorchServe's /ping plugin says 200
    # only after initialize() returns; the ASGI frontend's /ping once this returns).
    logger.info(
        "backend %s ready in %.1f s (n_positions=%d, n_slots=%d, replicas=%d, scheduler=%s)",
        backend.name,
        time.perf_counter() - started,
        backend.n_positions,
        backend.n_slots,
        config.scheduler.replicas,
        config.scheduler.mode,
    )
    return backend
