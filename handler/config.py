"""The handler's configuration: the `handler:` and `micro_batching:` sections of
model-config.yaml, parsed once into immutable objects.

Unknown keys and bad values raise `ConfigError` with the key's full path and a hint,
so a typo fails `initialize` loudly instead of being silently ignored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from handler.neuron.config import NeuronxConfig

AMP_TYPES = ("f32", "f16", "bf16")
SectionT = TypeVar("SectionT", bound=BaseModel)


class ConfigError(ValueError):
    """model-config.yaml is wrong; the message names the key and how to fix it."""


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


class MicroBatchingConfig(_Section):
    micro_batch_size: int = Field(default=1, ge=1, le=256)
    parallelism: Parallelism = Parallelism()


class HandlerConfig(_Section):
    """The `handler:` section."""

    model_checkpoint_dir: str = Field(min_length=1)
    backend: Literal["hf", "sim", "neuronx", "auto"] = "hf"
    amp: Literal["f32", "f16", "bf16"] = "f32"
    tp_degree: int = Field(default=1, ge=1, le=32)
    n_positions: int = Field(default=1024, ge=8)
    default_max_new_tokens: int = Field(default=64, ge=1)
    max_new_tokens: int = Field(default=512, ge=1, description="the largest max_new_tokens a request may ask for")
    trust_remote_code: bool = False
    generate_timeout_s: float = Field(default=600.0, gt=0, description="longest wait for one decode step")
    cpu_threads: int | None = Field(
        default=None,
        ge=1,
        le=256,
        description="torch intra-op threads for the hf backend; None: torch's default (every core)",
    )
    sim: SimConfig | None = None
    neuronx: NeuronxConfig = NeuronxConfig()  # read by backend neuronx (and auto on an inf2 host)

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


class ServingConfig(BaseModel):
    """Everything the handler reads from model-config.yaml."""

    model_config = ConfigDict(frozen=True)

    handler: HandlerConfig
    micro_batching: MicroBatchingConfig
    batch_size: int

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
        micro = _parse_section(MicroBatchingConfig, raw.get("micro_batching") or {}, "micro_batching")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"model-config.yaml: batchSize must be a positive integer, got {batch_size!r}")
        if micro.micro_batch_size > batch_size:
            raise ConfigError(
                f"model-config.yaml: micro_batching.micro_batch_size ({micro.micro_batch_size}) is above batchSize "
                f"({batch_size}); a micro-batch could never fill. Set micro_batch_size <= batchSize"
            )
        return cls(handler=handler, micro_batching=micro, batch_size=batch_size)


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
