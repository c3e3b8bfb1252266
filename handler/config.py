"""The handler's configuration: the `handler:` and `micro_batching:` sections of
model-config.yaml, parsed once into immutable objects.

Unknown keys and bad values raise `ConfigError` with the key's full path and a hint,
so a typo fails `initialize` loudly instead of being silently ignored.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from handler.errors import ConfigError
from handler.lora import ADAPTER_NAME
from handler.neuron.config import NeuronxConfig
from handler.neuron.nxdi_config import NxdiConfig

logger = logging.getLogger(__name__)

AMP_TYPES = ("f32", "f16", "bf16")
SectionT = TypeVar("SectionT", bound=BaseModel)
# jobQueueSize above this many x n_slots: the back of a full queue waits that many request
# durations for a slot, longer than clients wait; such a queue turns fast 503s into timeouts.
JOB_QUEUE_WARN_PER_SLOT = 32


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Parallelism(_Section):
    """Threads per MicroBatching stage (TorchServe's `parallelism`)."""

    preprocess: int = Field(default=1, ge=1, le=16)
    inference: int = Field(default=1, ge=1, le=16)
    postprocess: int = Field(default=1, ge=1, le=16)


class SimConfig(_Section):
    """The `handler.sim:` section: the simulated Inferentia backend (no weights)."""

    profile: str = Field(min_length=1, description="timing profile file (absolute, or relative to the archive)")
    charge: Literal["live_rows", "compiled_batch"] = "live_rows"
    time_scale: float = Field(default=1.0, ge=0, description="multiplies every simulated sleep; 0 = no sleeping")
    mean_natural_tokens: int = Field(default=256, ge=1, description="mean length at which a request emits EOS")
    # 0.5: this repository's prompt lookup took about 0.45 per drafted token on text that repeats
    # itself little and about 0.9 on an answer copying its prompt (docs/speculative.md, make
    # bench-speculation, solved for a); EAGLE drafters are commonly quoted at 0.6-0.8 on chat. The low
    # end: a what-if run promises no more than a generic answer gets. A guess for any other workload.
    speculation_acceptance: float = Field(
        default=0.5,
        ge=0.0,
        le=1.0,
        allow_inf_nan=False,
        description=(
            "with scheduler.speculation: the probability that each of a decode row's k drafted tokens is "
            "accepted (in turn, up to the first rejection), so a verify step gives a row 1 to k + 1 tokens, "
            "(1 - a^(k+1)) / (1 - a) on average; ignored without scheduler.speculation"
        ),
    )
    hf_config: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "the simulated model's config.json (a file or a checkpoint directory; absolute, or relative like "
            "profile): the sim then runs the device backends' memory-fit check at start, refusing a layout "
            "(handler.tp_degree, handler.amp, the profile's batch_size as n_slots, n_positions) that could not fit "
            "in a NeuronCore's HBM. Unset: no check (the tokenizer's checkpoint is a stand-in)"
        ),
    )


class SpeculationConfig(_Section):
    """`scheduler.speculation`: several tokens per row per step, exactly the output of one at a time
    (docs/speculative.md). `ngram` proposes what followed the row's last n tokens earlier in its own
    text (prompt lookup: no draft model) and verifies the proposals in the step's one forward."""

    method: Literal["ngram"]
    num_speculative_tokens: int = Field(ge=1, le=8, description="tokens proposed per row per step (k)")
    prompt_lookup_min: int = Field(
        default=2,
        ge=1,
        le=16,
        description="the shortest n-gram matched (2: a one-token match proposes mostly what the model rejects)",
    )
    prompt_lookup_max: int = Field(default=4, ge=1, le=16, description="the longest n-gram matched (tried first)")
    backoff: bool = Field(
        default=False,
        description="a row whose proposals keep taking nothing sits out 1, 3, 7, then 15 steps before it proposes "
        "again (one accepted token resets it): its wider rows cost the verify forward and gain nothing. Off by "
        "default: measured to help with prompt_lookup_min 1, not with the default 2 (docs/speculative.md)",
    )

    @model_validator(mode="after")
    def _check_lookup(self) -> SpeculationConfig:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"prompt_lookup_min ({self.prompt_lookup_min}) is above prompt_lookup_max ({self.prompt_lookup_max})"
            )
        return self


class SchedulerConfig(_Section):
    """The `scheduler:` section: how requests share the model's slots."""

    mode: Literal["continuous", "static"] = Field(
        default="continuous",
        description="continuous: requests join and leave between decode steps (TorchServe continuousBatching); "
        "static: TorchServe batching + MicroBatching, a micro-batch runs to its end",
    )
    n_slots: int = Field(
        default=4, ge=1, le=256, description="sequences decoded together: the compiled batch size on neuronx"
    )
    prefill_token_budget: int = Field(
        default=2048,
        ge=1,
        description="prompt tokens prefilled in one step (at least one request); bounds the pause of running streams",
    )
    overlap: bool = Field(default=True, description="run the next step while this step's tokens travel to the frontend")
    admission_wait: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="with overlap, a free slot and a slot freed in the last steps, the longest the engine holds its "
        "next step for the frontend's next call (which brings what arrived during the last step), as a fraction of "
        "the last step's time; it holds only while the calls usually come within that (0: never holds)",
    )
    speculation: SpeculationConfig | None = None
    replicas: int = Field(
        default=1,
        ge=1,
        le=64,
        description="model copies behind the one continuous worker, each a child process with its own n_slots "
        "(and, on neuronx, its own tp_degree NeuronCores); 1 serves in the worker's own process",
    )

    @property
    def total_slots(self) -> int:
        """Sequences the worker decodes at once: every replica's slots."""
        return self.replicas * self.n_slots


class GrammarConfig(_Section):
    """`handler.grammar`: how constraints (structured output, tools) are compiled on receipt."""

    compile_threads: int = Field(
        default=2,
        ge=1,
        le=16,
        description="constraints compiled at once, off the step thread (llguidance releases the GIL meanwhile; "
        "the threads run at a lower priority than the steps)",
    )
    compile_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=600,
        description="a constraint whose compile runs longer is that request's 400 (time queued does not count)",
    )
    cache_mb: int = Field(
        default=256,
        ge=1,
        le=65_536,
        description="what constraints leave cached (grammar texts, compiled matchers), in MiB for the whole "
        "worker: its replica processes share it",
    )
    max_symbols: int = Field(
        default=50_000,
        ge=1_000,
        le=60_000,
        description="llguidance's max_grammar_size: the most grammar symbols a constraint may compile to "
        "(its matcher cannot hold more than 65,525)",
    )
    max_constraint_bytes: int = Field(
        default=512 * 1024,
        ge=1024,
        le=64 * 2**20,
        description="the largest constraint a request may bring, in UTF-8 bytes of its JSON Schema or grammar as "
        "the request gives it (response_format's schema, TGI's and the native grammar, the tools' parameters "
        "together when tool_choice forces a call), descriptions included: larger is a 400 naming the field on "
        "receipt, before any compile. 512 KiB holds a strict schema at OpenAI's documented limits (5,000 "
        "properties, 120,000 characters of names and enum values: about 360 KB) with room for descriptions",
    )


class LoraConfig(_Section):
    """`handler.lora`: LoRA adapters on the base model, chosen per request (docs/lora.md)."""

    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="adapter name -> a local folder in PEFT's format (adapter_config.json + "
        "adapter_model.safetensors); a relative path is inside the model archive. A request names one by its "
        "OpenAI `model`, the native `adapter` or TGI's `parameters.adapter_id`",
    )
    max_loras: int = Field(
        default=4, ge=1, le=64, description="distinct adapters in one step; a request for another waits for a place"
    )
    max_lora_rank: int = Field(default=16, ge=1, le=256, description="the highest adapter rank (r) accepted")
    runtime_updates: bool = Field(
        default=False,
        description="POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's API), behind the key",
    )

    @field_validator("adapters")
    @classmethod
    def _check_names(cls, adapters: dict[str, str]) -> dict[str, str]:
        for name in adapters:
            if not re.match(ADAPTER_NAME, name):
                raise ValueError(
                    f"adapter name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (it is echoed in responses)"
                )
        return adapters


class ResponsesConfig(_Section):
    """`handler.responses`: the Responses API's stored responses (`store: true`, OpenAI's default), kept
    per worker so that `previous_response_id` continues a conversation (docs/openai.md#responses)."""

    # Each stored response repeats the conversation before it, so a conversation of n turns of t bytes
    # stores about n²t/2 over its life. The bound need not hold that: the oldest go first, and a turn
    # continues from its newest response only, whose size the context window bounds (~0.5 MB of text at
    # 128K tokens, ~32 KB at 8K): 256 MiB keeps the newest turn of hundreds of conversations at 128K and
    # thousands at 8K, a few percent of an inf2.xlarge's 16 GiB. Python holds 1.0-1.7x the JSON for
    # typical turns (measured: handler/api/responses/store.py).
    store_mb: int = Field(
        default=256,
        ge=0,
        le=65536,
        description="the most the worker's stored responses take, in MiB of their JSON (0: store none); the "
        "oldest go first",
    )
    # OpenAI keeps stored responses 30 days in a database; this is one worker's memory, lost on a restart,
    # so what relies on it is a conversation going on now (an agent's next call, a person's next message).
    max_age_s: float = Field(
        default=3600.0, gt=0, description="a stored response is forgotten this long after it was stored"
    )


class MicroBatchingConfig(_Section):
    micro_batch_size: int = Field(default=1, ge=1, le=256)
    parallelism: Parallelism = Parallelism()


class EmbedBuckets(_Section):
    """`handler.embed.buckets`: the shapes `torch_neuronx.trace` compiles the encoder for (backend neuronx;
    a traced module takes only its own shape). Rows are padded to the smallest sequence bucket that fits
    and grouped into the smallest batch bucket that fits; a larger group is split."""

    batch_sizes: list[int] = Field(
        default_factory=lambda: [1, 8], description="rows per compiled call, strictly increasing, e.g. [1, 8]"
    )
    seq_lengths: list[int] | None = Field(
        default=None,
        description="tokens per row, strictly increasing, the largest within the model's max_length (checked at "
        "load); the largest is the longest input served. Default: 128, 256, ... below the model's max_length, "
        "then max_length",
    )

    @field_validator("batch_sizes", "seq_lengths")
    @classmethod
    def _increasing(cls, value: list[int] | None) -> list[int] | None:
        if value is None:
            return None
        if not value or any(v < 1 for v in value):
            raise ValueError("must be a non-empty list of positive integers, e.g. [1, 8]")
        if sorted(set(value)) != value:
            raise ValueError("must be strictly increasing, e.g. [128, 256]")
        return value


class EmbedConfig(_Section):
    """`handler.embed`: the embedding task (`handler.task: embed`, docs/embeddings.md)."""

    max_inputs: int = Field(
        default=256,
        ge=1,
        le=4096,
        description="the most inputs (strings or token-id lists) one request may carry (OpenAI's own API allows 2048)",
    )
    encode_batch_size: int = Field(
        default=32,
        ge=1,
        le=1024,
        description="inputs run through the encoder in one forward: a TorchServe batch's inputs, every request's "
        "together, sorted by length and padded in groups of this many",
    )
    buckets: EmbedBuckets = EmbedBuckets()  # read by backend neuronx (and auto on an inf2 host)


class HandlerConfig(_Section):
    """The `handler:` section."""

    model_checkpoint_dir: str = Field(min_length=1)
    task: Literal["generate", "embed"] = Field(
        default="generate",
        description="generate: an LLM (text generation, streamed); embed: a sentence-transformers encoder serving "
        "embeddings (TorchServe's classic batching, no continuousBatching; docs/embeddings.md)",
    )
    embed: EmbedConfig = EmbedConfig()
    backend: Literal["hf", "sim", "neuronx", "nxdi", "auto"] = "hf"
    amp: Literal["f32", "f16", "bf16"] = "f32"
    tp_degree: int = Field(default=1, ge=1, le=32)
    n_positions: int = Field(default=1024, ge=8)
    default_max_new_tokens: int = Field(default=64, ge=1)
    max_new_tokens: int = Field(default=512, ge=1, description="the largest max_new_tokens a request may ask for")
    trust_remote_code: bool = False
    tool_call_parser: Literal["llama3_json"] = Field(
        default="llama3_json",
        description="the model family's tool-call format for chat tools (handler/api/tool_parsers): "
        'llama3_json is Llama 3.1+\'s {"name", "parameters"} JSON',
    )
    max_stop_strings: int = Field(
        default=16, ge=1, le=256, description="the most stop strings a request may give (OpenAI's own API allows 4)"
    )
    max_stop_chars: int = Field(
        default=4096,
        ge=1,
        le=1_000_000,
        description="the most characters a request's stop strings may hold in all (matching costs their length "
        "once per request, never per token)",
    )
    max_json_depth: int = Field(
        default=64,
        ge=4,
        le=512,
        description="the deepest nesting of arrays and objects a request body may have (schemas included)",
    )
    grammar: GrammarConfig = GrammarConfig()
    step_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a model step running longer fails the requests in flight (continuous mode) instead of hanging",
    )
    max_queue_wait_s: float = Field(
        default=30.0,
        gt=0,
        description="continuous mode, both frontends: a request that has not got its first token this long after "
        "it reached the engine (waiting for a slot) is answered 503 with Retry-After instead of waiting on",
    )
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="torch intra-op threads for the hf backend; None: torch's default (every core)",
    )
    no_route_api: Literal["native", "tgi"] = Field(
        default="native",
        description="how a request that names no route (/invocations, /predictions/<model>, every route on "
        'TorchServe 0.11) with an {"inputs", "parameters"} body is answered: native NDJSON/JSON, or TGI\'s '
        "wire format (non-streamed as a list, like the SageMaker Hugging Face LLM containers)",
    )
    lora: LoraConfig | None = None
    responses: ResponsesConfig = ResponsesConfig()
    sim: SimConfig | None = None
    neuronx: NeuronxConfig = NeuronxConfig()  # read by backend neuronx (and auto on an inf2 host)
    nxdi: NxdiConfig = NxdiConfig()  # read by backend nxdi (and auto on an inf2 host with NxD Inference)

    @model_validator(mode="after")
    def _check_lengths(self) -> HandlerConfig:
        if self.default_max_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"default_max_new_tokens ({self.default_max_new_tokens}) is above max_new_tokens "
                f"({self.max_new_tokens}); lower it or raise max_new_tokens"
            )
        if self.max_new_tokens >= self.n_positions:
            raise ValueError(
                f"max_new_tokens ({self.max_new_tokens}) leaves no room for a prompt in n_positions "
                f"({self.n_positions}); keep it below n_positions"
            )
        return self

    def checkpoint_path(self, model_dir: str | Path) -> Path:
        """Absolute checkpoint path; a relative one is inside the model archive."""
        path = Path(self.model_checkpoint_dir)
        return path if path.is_absolute() else Path(model_dir) / path

    def adapter_paths(self, model_dir: str | Path) -> dict[str, Path]:
        """Each configured LoRA adapter's absolute folder (a relative one is inside the archive)."""
        adapters = self.lora.adapters if self.lora is not None else {}
        return {
            name: Path(model_dir) / path if not Path(path).is_absolute() else Path(path)
            for name, path in adapters.items()
        }


class ServingConfig(BaseModel):
    """Everything the handler reads from model-config.yaml."""

    model_config = ConfigDict(frozen=True)

    handler: HandlerConfig
    micro_batching: MicroBatchingConfig
    scheduler: SchedulerConfig = SchedulerConfig()
    batch_size: int
    job_queue_size: int | None = None  # TorchServe's jobQueueSize; None: the frontend's job_queue_size (100)

    @property
    def max_adapters(self) -> int | None:
        """Distinct LoRA adapters one step may run (None: no adapters configured, no limit needed)."""
        return None if self.handler.lora is None else self.handler.lora.max_loras

    def with_adapters(self, adapters: dict[str, str]) -> ServingConfig:
        """The same config serving these LoRA adapters (what a replica restarted after run-time loads
        and unloads starts with)."""
        lora = self.handler.lora if self.handler.lora is not None else LoraConfig()
        handler = self.handler.model_copy(update={"lora": lora.model_copy(update={"adapters": dict(adapters)})})
        return self.model_copy(update={"handler": handler})

    @property
    def grammar_cache_bytes(self) -> int:
        """Each process's share of `handler.grammar.cache_mb`: with replicas, the worker (receipt
        checks) and each replica process (its slots' matchers) hold a cache of their own."""
        replicas = self.scheduler.replicas
        processes = replicas + 1 if replicas > 1 else 1
        return self.handler.grammar.cache_mb * 2**20 // processes

    @classmethod
    def from_model_yaml(cls, raw: dict[str, Any] | None) -> ServingConfig:
        """Parse TorchServe's `context.model_yaml_config`."""
        raw = raw or {}
        if not isinstance(raw.get("handler"), dict):
            raise ConfigError(
                "model-config.yaml: the 'handler:' section is missing; it needs at least model_checkpoint_dir"
            )
        batch_size = raw.get("batchSize", 1)
        handler = _parse_section(HandlerConfig, raw["handler"], "handler")
        if handler.task == "embed":
            return cls._embedding(handler, raw, batch_size)
        micro = _parse_section(MicroBatchingConfig, raw.get("micro_batching") or {}, "micro_batching")
        scheduler = _parse_section(SchedulerConfig, raw.get("scheduler") or {}, "scheduler")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"model-config.yaml: batchSize must be a positive integer, got {batch_size!r}")
        _check_scheduler(scheduler, bool(raw.get("continuousBatching", False)), batch_size)
        _check_workers(scheduler, raw)
        _check_batch_delay(scheduler, raw)
        job_queue_size = _check_job_queue(raw, scheduler.total_slots)
        if scheduler.mode == "static" and micro.micro_batch_size > scheduler.n_slots:
            raise ConfigError(
                f"model-config.yaml: micro_batching.micro_batch_size ({micro.micro_batch_size}) is above "
                f"scheduler.n_slots ({scheduler.n_slots}); set micro_batch_size <= n_slots"
            )
        if scheduler.mode == "static" and handler.lora is not None:
            raise ConfigError(
                "model-config.yaml: handler.lora needs scheduler.mode continuous (each step's rows name their "
                "adapters); static mode serves the base model only"
            )
        if handler.backend == "neuronx" and handler.lora is not None:
            raise ConfigError(
                "model-config.yaml: handler.lora: backend neuronx (transformers-neuronx) serves no LoRA adapters; "
                "use backend nxdi (NxD Inference's multi-LoRA serving) or hf"
            )
        _check_speculation(scheduler, handler)
        _check_nxdi_speculation(scheduler, handler)
        if scheduler.mode == "static" and micro.micro_batch_size > batch_size:
            raise ConfigError(
                f"model-config.yaml: micro_batching.micro_batch_size ({micro.micro_batch_size}) is above batchSize "
                f"({batch_size}); a micro-batch could never fill. Set micro_batch_size <= batchSize"
            )
        return cls(
            handler=handler,
            micro_batching=micro,
            scheduler=scheduler,
            batch_size=batch_size,
            job_queue_size=job_queue_size,
        )

    @classmethod
    def _embedding(cls, handler: HandlerConfig, raw: dict[str, Any], batch_size: Any) -> ServingConfig:
        """`handler.task: embed`: TorchServe's classic batching (an embedding has no stream), an encoder
        backend (hf, neuronx or auto); the generation sections do not apply."""
        if raw.get("continuousBatching"):
            raise ConfigError(
                "model-config.yaml: handler.task is 'embed' but continuousBatching is true; an embedding is answered "
                "whole, with no stream: remove continuousBatching and batch with batchSize and maxBatchDelay"
            )
        for section in ("scheduler", "micro_batching"):
            if raw.get(section) is not None:
                raise ConfigError(
                    f"model-config.yaml: {section}: applies to handler.task generate only; remove it (an embedding "
                    "archive batches with batchSize, maxBatchDelay and handler.embed.encode_batch_size)"
                )
        _check_embed_backend(handler)
        if handler.lora is not None:
            raise ConfigError(
                "model-config.yaml: handler.lora: an embedding archive serves no LoRA adapters (they adapt a "
                "generating model); remove handler.lora"
            )
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"model-config.yaml: batchSize must be a positive integer, got {batch_size!r}")
        scheduler = SchedulerConfig(mode="static")
        _check_batch_delay(scheduler, raw)
        return cls(
            handler=handler,
            micro_batching=MicroBatchingConfig(),
            scheduler=scheduler,
            batch_size=batch_size,
            job_queue_size=_check_job_queue(raw, batch_size),
        )


# handler.neuronx keys that configure transformers-neuronx's LLM and mean nothing to a traced encoder
_LLM_ONLY_NEURONX_KEYS = (
    "model_class",
    "context_length_estimate",
    "group_query_attention",
    "quantize_weights",
    "neuron_config",
    "output_all_logits",
)


def _check_embed_backend(handler: HandlerConfig) -> None:
    """An encoder runs on hf (CPU), neuronx (torch_neuronx.trace, one core per worker) or auto."""
    if handler.backend not in ("hf", "neuronx", "auto"):
        raise ConfigError(
            f"model-config.yaml: handler.backend: {handler.backend!r} cannot serve handler.task embed; an encoder "
            "runs on hf (transformers on CPU), neuronx (compiled with torch_neuronx.trace for Inferentia2) or auto "
            "(neuronx on a Neuron host, else hf). sim and nxdi serve LLMs only"
        )
    if handler.backend == "hf":
        return
    if handler.tp_degree != 1:
        raise ConfigError(
            f"model-config.yaml: handler.tp_degree: {handler.tp_degree}; an encoder is traced for one NeuronCore "
            "(one copy per worker, one worker per core: docs/embeddings.md); set tp_degree: 1"
        )
    set_keys = sorted(set(handler.neuronx.model_fields_set) & set(_LLM_ONLY_NEURONX_KEYS))
    if set_keys:
        raise ConfigError(
            f"model-config.yaml: handler.neuronx.{set_keys[0]}: configures transformers-neuronx's LLM and does not "
            "apply to handler.task embed; an encoder reads handler.neuronx's cache_dir, compile_cache, num_cores, "
            "compile_on_start, compiler_flags and warmup, and handler.embed.buckets"
        )


def _check_job_queue(raw: dict[str, Any], n_slots: int) -> int | None:
    """`jobQueueSize`: the requests TorchServe's frontend queues for the model beyond the
    `batchSize` in the worker; one more gets a fast 503 (0.11 and 0.12: Model.addJob). The
    frontend ignores a non-integer and reads 0 or less as "use config.properties'
    job_queue_size" (default 100), both silently: refuse them. Unset: warn, with the rule."""
    suggested = 4 * n_slots
    if "jobQueueSize" not in raw:
        logger.warning(
            "model-config.yaml sets no jobQueueSize: TorchServe queues up to job_queue_size (config.properties, "
            "default 100) requests before it answers 503; size it from the slots, e.g. jobQueueSize: %d "
            "(docs/configuration.md)",
            suggested,
        )
        return None
    size = raw["jobQueueSize"]
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ConfigError(
            f"model-config.yaml: jobQueueSize must be a positive integer, got {size!r}; TorchServe would silently "
            f"fall back to config.properties' job_queue_size (default 100). Size it from the slots, e.g. "
            f"jobQueueSize: {suggested}"
        )
    if size > JOB_QUEUE_WARN_PER_SLOT * n_slots:
        logger.warning(
            "jobQueueSize %d is above %d x the worker's slots (%d, replicas x n_slots): the last queued request "
            "waits about %d request "
            "durations for a slot, longer than most clients wait, so overload ends in client timeouts instead of "
            "fast 503s; e.g. jobQueueSize: %d",
            size,
            JOB_QUEUE_WARN_PER_SLOT,
            n_slots,
            size // n_slots,
            suggested,
        )
    return size


def _check_batch_delay(scheduler: SchedulerConfig, raw: dict[str, Any]) -> None:
    """`maxBatchDelay: 0` is not zero: TorchServe (0.11 and 0.12, ModelManager) replaces a
    value that is not positive, or none, with its default 100 ms, and in continuous mode every
    request that finds the worker idle waits that long before its prefill (measured: idle
    TTFT 140 ms against a 28 ms prefill). 1 ms is the shortest wait it keeps."""
    delay = raw.get("maxBatchDelay")
    if delay is None:
        if scheduler.mode == "continuous":  # static: the 100 ms batch window is a fair choice
            logger.warning(
                "model-config.yaml sets no maxBatchDelay: TorchServe waits its default 100 ms for company "
                "whenever a request finds the worker idle; set maxBatchDelay: 1"
            )
        return
    if not isinstance(delay, int) or delay < 1:
        raise ConfigError(
            f"model-config.yaml: maxBatchDelay must be a positive number of milliseconds, got {delay!r}: TorchServe "
            "replaces 0 (or no value) with 100 ms, which every request that finds the worker idle would wait. "
            + ("Set maxBatchDelay: 1" if scheduler.mode == "continuous" else "Set the batch window you want, e.g. 20")
        )


def _check_workers(scheduler: SchedulerConfig, raw: dict[str, Any]) -> None:
    """One worker per model in continuous mode: an idle worker waits for new requests while
    holding the model's job-queue lock in TorchServe's frontend (0.11 and 0.12:
    Model.pollInferJob), so a worker with requests in flight could not get its next step
    until a new request arrived."""
    workers = max(int(raw.get("minWorkers") or 1), int(raw.get("maxWorkers") or 1))
    if scheduler.mode == "continuous" and workers > 1:
        raise ConfigError(
            f"model-config.yaml: minWorkers/maxWorkers ({workers}) must be 1 with scheduler.mode continuous: "
            "TorchServe's frontend stalls a worker's next step while another worker idles. Serve more requests "
            "per worker with scheduler.n_slots, or run more model copies in the one worker with scheduler.replicas"
        )


def _check_speculation(scheduler: SchedulerConfig, handler: HandlerConfig) -> None:
    """Prompt lookup where its tokens can be verified exactly: the step engine's rows on backend hf (and
    the sim, which models its timing). nxdi speculates with EAGLE, compiled in (handler.nxdi.speculation)."""
    if scheduler.speculation is None:
        return
    if scheduler.mode == "static":
        raise ConfigError(
            "model-config.yaml: scheduler.speculation needs scheduler.mode continuous (the step engine gives a row "
            "several tokens a step); static mode decodes one token at a time"
        )
    if handler.backend == "nxdi":
        raise ConfigError(
            "model-config.yaml: scheduler.speculation: backend nxdi samples on the device and cannot verify the "
            "engine's prompt-lookup proposals; it speculates with an EAGLE draft compiled with the model: set "
            "handler.nxdi.speculation instead"
        )
    if handler.backend not in ("hf", "sim"):
        raise ConfigError(
            f"model-config.yaml: scheduler.speculation: backend {handler.backend} does not verify proposed tokens; "
            "transformers-neuronx's speculative models take one sequence at a time (no continuous batching). On "
            "Inferentia2, use backend nxdi with an EAGLE draft (handler.nxdi.speculation); prompt lookup is served on "
            "backend hf"
        )


def _check_nxdi_speculation(scheduler: SchedulerConfig, handler: HandlerConfig) -> None:
    """EAGLE on nxdi (handler.nxdi.speculation) where NxD Inference's fused speculation can serve it:
    facts in handler/neuron/nxdi_speculation.py."""
    speculation = handler.nxdi.speculation
    if speculation is None:
        return
    key = "model-config.yaml: handler.nxdi.speculation"
    if handler.backend not in ("nxdi", "auto"):
        raise ConfigError(
            f"{key}: only backend nxdi reads it (NxD Inference's EAGLE), not backend {handler.backend}; remove it, or "
            "use scheduler.speculation (prompt lookup) on backend hf"
        )
    if scheduler.mode == "static":
        raise ConfigError(
            f"{key} needs scheduler.mode continuous: a fused speculation step gives a row up to k + 1 tokens, which "
            "only the step engine takes; static mode decodes one token at a time"
        )
    if handler.lora is not None:
        raise ConfigError(
            f"{key} cannot go with handler.lora: NxD Inference's fused speculation model never passes adapter_ids to "
            "the target (models/model_base.py NeuronFusedSpecModel.forward), so every row would run without its "
            "adapter; serve adapters without speculation, or on backend hf"
        )
    reserved = speculation.num_speculative_tokens - 1
    if handler.max_new_tokens + reserved >= handler.n_positions:
        raise ConfigError(
            f"{key}.num_speculative_tokens: {speculation.num_speculative_tokens} drafted tokens keep the last "
            f"{reserved} of the n_positions ({handler.n_positions}) for the look-ahead, which leaves no room for a "
            f"prompt beside max_new_tokens ({handler.max_new_tokens}); lower max_new_tokens or k, or raise n_positions"
        )


def _check_scheduler(scheduler: SchedulerConfig, continuous_batching: bool, batch_size: int) -> None:
    """The frontend's mode must match the scheduler's: each speaks its own protocol."""
    if scheduler.mode == "continuous" and not continuous_batching:
        raise ConfigError(
            "model-config.yaml: scheduler.mode is 'continuous' but continuousBatching is not true; set "
            "continuousBatching: true (TorchServe then calls the handler once per step) or scheduler.mode: static"
        )
    if scheduler.mode == "static" and continuous_batching:
        raise ConfigError(
            "model-config.yaml: scheduler.mode is 'static' but continuousBatching is true; remove continuousBatching "
            "or set scheduler.mode: continuous"
        )
    if scheduler.mode == "static" and scheduler.replicas > 1:
        raise ConfigError(
            f"model-config.yaml: scheduler.replicas ({scheduler.replicas}) needs scheduler.mode continuous; in static "
            "mode each worker holds one model copy: set minWorkers/maxWorkers for more copies"
        )
    slots = scheduler.total_slots
    if scheduler.mode == "continuous" and batch_size < slots:
        what = (
            f"scheduler.n_slots ({scheduler.n_slots})"
            if scheduler.replicas == 1
            else f"scheduler.replicas x n_slots ({scheduler.replicas} x {scheduler.n_slots} = {slots})"
        )
        raise ConfigError(
            f"model-config.yaml: batchSize ({batch_size}) is below {what}; in "
            "continuous mode batchSize is how many requests the frontend keeps in flight (slots + waiting): set "
            f"batchSize >= {slots}, e.g. {2 * slots}"
        )


def _parse_section(model: type[SectionT], raw: Any, section: str) -> SectionT:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, section)) from None


def _describe(exc: ValidationError, section: str) -> str:
    problems = []
    for err in exc.errors():
        key = ".".join(str(part) for part in (section, *err["loc"]))
        if err["type"] == "extra_forbidden":
            problems.append(f"{key}: unknown key; remove it or check its spelling")
        elif err["type"] == "missing":
            problems.append(f"{key}: required key is missing")
        else:
            problems.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
    return "model-config.yaml: " + "; ".join(problems)
