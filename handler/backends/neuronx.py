"""The `neuronx` backend: a Llama-family model compiled for Inferentia2 by transformers-neuronx,
driven a step at a time with the SDK's continuous batching.

Start-up, in order (each step logged, with how long it took):
1. place this worker on its NeuronCores (handler/neuron/cores.py) and set the Neuron
   environment: NEURON_RT_VISIBLE_CORES, NEURON_CC_FLAGS, the compile cache
   (handler/neuron/environment.py), all before transformers_neuronx is imported;
2. `<ModelClass>.from_pretrained(checkpoint, batch_size=n_slots, tp_degree, amp, n_positions,
   context_length_estimate, neuron_config=NeuronConfig(continuous_batching=
   ContinuousBatchingConfig(max_num_seqs=n_slots), <handler.neuronx options>))`. Keys the
   backend owns or cannot honour are refused first (handler/neuron/config.py), and the SDK's
   own refusals (asserts, ValueErrors) become a ConfigError naming the key
   (handler/neuron/options.py);
3. if the saved artifacts' manifest matches (handler/neuron/artifacts.py): `load(dir)` then
   `to_neuron()`, no compile; else, under a host-wide lock, `to_neuron()` compiles and
   `save(dir)` stores the NEFFs with a fresh manifest. With `compile_on_start: false` a
   mismatch fails the start instead, and nothing is written (read-only model directories);
4. `warmup()`: per context bucket, a prefill of that length and a decode step over every slot.

Serving: the step contract of handler/backends/base.py on the SDK's continuous batching
(transformers-neuronx 0.13, base.py: `_prepare_for_continuous_batching`,
`_prepare_for_par_ctx_rhs_padding`, `_postprocess`). Slot k of the engine is the SDK's
sequence id k (`start_ids`), i.e. line k of every KV cache; each slot remembers the token it
chose last and that token's position (cache id). The host picks every row's token of a step in
one call to the backend's host sampling (`host_sampling.HostSampling`; the device returns logits).

- prefill: one request at a time (under continuous batching the context kernel is compiled
  for batch 1, llama/model.py `context_batch_sizes`, so the SDK would loop anyway):
  `forward(input_ids [1, T], cache_ids [[0..T-1]], start_ids [slot])` runs the smallest
  context bucket >= T, writes positions 0..bucket-1 of the slot's line only, and returns the
  logits of position T-1 (`last_token_id` = the largest cache id). A T above the largest
  context bucket fails an assert in the SDK ("invalid input prompt length"), so
  `max_prompt_tokens` is the largest bucket and the service answers such a prompt 400.
- decode: `forward(input_ids [n, 1] = each slot's last token, cache_ids [n, 1] = its position,
  start_ids [n] = the slots)` returns `[n, vocab]` logits in input order. The decode kernel
  always runs the full [n_slots, 1] batch and gives every line left out of the call token 0 at
  cache id 0, overwriting position 0 of that line's KV: so a decode must name every live slot,
  and `decode()` refuses (ValueError) a call that does not.
- a 1-token prompt: `forward` takes T == 1 for token generation whatever the cache id, so the
  plain prefill of a 1-token prompt would be a decode call that overwrites position 0 of every
  other live slot. It is sent as T == 2 instead: `input_ids [[token, 0]]`,
  `cache_ids [[0, 0]]`. That is exactly the row the SDK itself builds for a 1-token prompt in
  the context path (input right-padded with 0; cache ids zero-padded, so `last_token_id` = 0;
  the padded cache ids are replaced by arange(bucket)), and the shape vLLM's Neuron runner sends
  for a short prompt batched with longer ones: the context kernel writes only this slot's line
  and returns the logits of position 0. What it leaves at positions >= 1 is padding, as after
  any prompt shorter than its bucket, and each decode writes its position before reading it.
  The row must be shorter than its bucket (a row that fills its bucket keeps its own cache ids,
  and [0, 0] would write two tokens at position 0): every bucket is >= 3 (MIN_BUCKET).
  (The other way, a decode call that re-feeds every live slot's previous token at its previous
  position, would rewrite every other slot's KV and rely on the device recomputing it bit for
  bit; this one touches no other line.)
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import importlib
import logging
import os
import shlex
import time
from collections.abc import Sequence
from typing import Any

import torch

from handler.backends.device_backend import compiler_version, package_version
from handler.backends.device_slots import LiveSlot, SlotDeviceBackend
from handler.errors import ConfigError
from handler.lora.adapters import AdapterSpec
from handler.neuron import artifacts, options
from handler.neuron.config import LORA_REFUSAL, MIN_BUCKET, NeuronxConfig
from handler.request import SlotRequest, SlotRequestError, TokenChoice
from handler.sampling.logprobs import prompt_logprobs

logger = logging.getLogger(__name__)

# The id the SDK right-pads prompts with (`utils.pad` fills 0); the second token of a 1-token prompt's row.
PAD_ID = 0


class NeuronxBackend(SlotDeviceBackend):
    name = "neuronx"
    settings: NeuronxConfig
    decode_trap = "the decode kernel runs all slots and overwrites position 0 of the KV of every slot left out"

    def _plan_buckets(self) -> list[int]:
        buckets = self._checked_buckets(self.settings.context_length_estimate, "context_length_estimate")
        if buckets[0] < MIN_BUCKET:  # only the default can get here (the config validates a list)
            raise ConfigError(
                f"model-config.yaml: handler.n_positions: {self.n_positions} makes a prompt bucket below {MIN_BUCKET} "
                f"tokens; use n_positions >= {MIN_BUCKET}"
            )
        return buckets

    def _int8_weights(self) -> bool:
        return self.settings.quantize_weights is not None

    def _gqa(self) -> str | None:
        return self.settings.group_query_attention

    @property
    def output_all_logits(self) -> bool:
        return self.settings.output_all_logits

    def _prepare(self) -> dict[str, Any]:
        self.tnx = importlib.import_module("transformers_neuronx")  # after the environment is set
        self.model_cls = self._model_class()
        self.neuron_config = options.build(self.tnx.NeuronConfig, self._neuron_config_options())
        return self.manifest_inputs()

    # -- configuration ---------------------------------------------------------------
    def _model_class(self) -> type:
        *module_path, class_name = self.settings.model_class.split(".")
        module_name = ".".join(["transformers_neuronx", *module_path])
        try:
            return getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError):
            raise ConfigError(
                f"model-config.yaml: handler.neuronx.model_class: transformers_neuronx has no "
                f"{self.settings.model_class!r}; use e.g. 'LlamaForSampling' or 'mistral.model.MistralForSampling'"
            ) from None

    @property
    def continuous_batching_settings(self) -> dict[str, Any]:
        """The ContinuousBatchingConfig keywords: one sequence slot per scheduler slot. The rest keep the
        SDK's defaults (no paged attention: that needs vLLM's block manager, `init_cache_engine`)."""
        return {"max_num_seqs": self.n_slots}

    def _neuron_config_options(self) -> dict[str, Any]:
        """The NeuronConfig keywords this configuration passes (an SDK error may name one of them)."""
        try:
            continuous_batching = self.tnx.ContinuousBatchingConfig(**self.continuous_batching_settings)
        except options.SDK_ERRORS as exc:
            raise ConfigError(
                f"model-config.yaml: scheduler.n_slots: transformers-neuronx's ContinuousBatchingConfig refused "
                f"{self.continuous_batching_settings}: {type(exc).__name__}: {exc}"
            ) from None
        chosen: dict[str, Any] = {**self.settings.neuron_config, "continuous_batching": continuous_batching}
        if self.settings.group_query_attention:
            chosen["group_query_attention"] = self.tnx.GQA(self.settings.group_query_attention)
        if self.output_all_logits:
            chosen["output_all_logits"] = True
        if self.settings.quantize_weights:
            chosen["quant"] = self.tnx.QuantizationConfig(
                quant_dtype=self.settings.quantize_weights, dequant_dtype=self.amp
            )
        return chosen

    def manifest_inputs(self) -> dict[str, Any]:
        """Everything the compiled NEFFs depend on (the weights are loaded separately, so not them)."""
        flags = shlex.split(os.environ.get("NEURON_CC_FLAGS", ""))
        config_json = (self.checkpoint / "config.json").read_bytes()
        return {
            "transformers_neuronx": package_version("transformers-neuronx", self.tnx),
            "neuronx_cc": compiler_version(),
            "model_class": self.settings.model_class,
            "model_config_sha256": hashlib.sha256(config_json).hexdigest()[:16],
            "batch_size": self.n_slots,
            "continuous_batching": self.continuous_batching_settings,
            "tp_degree": self.tp_degree,
            "amp": self.amp,
            "n_positions": self.n_positions,
            "context_length_estimate": self.context_buckets,
            "neuron_config": {
                "group_query_attention": self.settings.group_query_attention,
                "quantize_weights": self.settings.quantize_weights,
                # recorded only when on, so artifacts compiled before the switch existed still match
                **({"output_all_logits": True} if self.output_all_logits else {}),
                **dict(sorted(self.settings.neuron_config.items())),
            },
            "compiler_flags": " ".join(f for f in flags if not f.startswith("--cache_dir")),
        }

    # -- load or compile ---------------------------------------------------------------
    def _build(self) -> Any:
        kwargs: dict[str, Any] = {
            "batch_size": self.n_slots,  # = max_num_seqs: the SDK's sanity check insists
            "tp_degree": self.tp_degree,
            "amp": self.amp,
            "n_positions": self.n_positions,
            "context_length_estimate": self.context_buckets,
            "neuron_config": self.neuron_config,
        }
        try:
            return self.model_cls.from_pretrained(str(self.checkpoint), **kwargs)
        except KeyError as exc:  # an amp it has no dtype for
            key = "handler.amp" if exc.args[:1] == (self.amp,) else options.NEURON_CONFIG_KEY
            raise ConfigError(f"model-config.yaml: {key}: transformers-neuronx refused it: KeyError {exc}") from exc
        except (AssertionError, ValueError) as exc:  # its load-time sanity checks and constructor asserts
            key = options.blame(str(exc), self._neuron_config_options(), kwargs)
            raise ConfigError(
                f"model-config.yaml: {key}: transformers-neuronx refused the model settings {self._described(kwargs)}: "
                f"{type(exc).__name__}: {exc}"
            ) from exc

    def _described(self, kwargs: dict[str, Any]) -> str:
        shown = {k: v for k, v in kwargs.items() if k != "neuron_config"}
        shown["continuous_batching"] = self.continuous_batching_settings
        if self.settings.neuron_config:
            shown["neuron_config"] = dict(self.settings.neuron_config)
        return str(shown)

    def _load(self) -> tuple[Any | None, str]:
        """The saved artifacts on the cores; or None and why, when their NEFFs do not fit after all."""
        started = time.perf_counter()
        model = self._build()
        model.load(str(self.cache.artifacts_dir))
        try:
            model.to_neuron()
        except FileNotFoundError as exc:
            del model
            gc.collect()
            return None, str(exc)
        logger.info(
            "neuronx: path=load: precompiled artifacts from %s on the cores in %.1f s (no compile)",
            self.cache.artifacts_dir,
            time.perf_counter() - started,
        )
        return model, ""

    def _compile(self) -> Any:
        started = time.perf_counter()
        model = self._build()
        model.to_neuron()
        logger.info(
            "neuronx: path=compile: compiled and loaded in %.1f s (continuous batching n_slots=%d tp_degree=%d amp=%s "
            "n_positions=%d buckets=%s)",
            time.perf_counter() - started,
            self.n_slots,
            self.tp_degree,
            self.amp,
            self.n_positions,
            self.context_buckets,
        )
        try:
            artifacts.save(self.cache.artifacts_dir, self.expected, model.save)
            logger.info("neuronx: saved compiled artifacts and manifest to %s", self.cache.artifacts_dir)
        except OSError as exc:
            logger.warning(
                "neuronx: could not save artifacts to %s (%s); the next start compiles again",
                self.cache.artifacts_dir,
                exc,
            )
        return model

    # -- serving: the step contract ------------------------------------------------------
    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        if prompt_logprobs and not self.output_all_logits:
            return (
                "prompt logprobs need the logits of every prompt position, which this model was not compiled to "
                "return: set handler.neuronx.output_all_logits: true (a recompile) to serve them"
            )
        return None

    def load_adapter(self, spec: AdapterSpec) -> None:
        raise NotImplementedError(LORA_REFUSAL)  # lora_shapes() stays None: the contract's "serves none"

    def prefill(self, requests: Sequence[SlotRequest]) -> list[TokenChoice]:
        self._live.check_prefill(requests, self.context_buckets)
        for request in requests:
            if request.adapter_id is not None:
                raise SlotRequestError(request.slot, LORA_REFUSAL, "model")
        if not requests:
            return []
        encoded = [self._encode(request.slot, request.prompt_ids) for request in requests]
        choices = self.sampling.first_tokens(requests, torch.stack([logits[-1] for logits in encoded]))
        for i, (request, logits) in enumerate(zip(requests, encoded, strict=True)):
            if request.prompt_logprobs:
                if logits.shape[0] < len(request.prompt_ids) - 1:
                    raise RuntimeError("neuronx: prompt logprobs need handler.neuronx.output_all_logits: true")
                prompt = prompt_logprobs(logits, request.prompt_ids, request.logprobs or 0)
                choices[i] = dataclasses.replace(choices[i], prompt=prompt)
            self._live[request.slot] = LiveSlot(choices[i].token_id, len(request.prompt_ids))
        return choices

    def decode(self, slots: Sequence[int]) -> list[TokenChoice]:
        slots = list(slots)
        states = self._live.check_decode(slots)
        if not slots:
            return []
        logits = self._forward(
            torch.tensor([[state.token] for state in states], dtype=torch.long),
            torch.tensor([[state.position] for state in states], dtype=torch.long),  # the SDK needs input_ids' dtype
            torch.tensor(slots, dtype=torch.long),
        )
        if self.output_all_logits:
            # With output_all_logits the SDK's _postprocess returns a decode's logits as the kernel made them:
            # one row per sequence line (all max_num_seqs of them), in line order, not in input order.
            logits = logits[torch.tensor(slots, dtype=torch.long)]
        choices = self.sampling.next_tokens(slots, logits)
        for state, choice in zip(states, choices, strict=True):
            state.token, state.position = choice.token_id, state.position + 1
        return choices

    def _encode(self, slot: int, prompt: Sequence[int]) -> torch.Tensor:
        """The context encoding of one prompt into the slot's KV line: logits [positions, vocab] whose last
        row is the prompt's last token's. Without output_all_logits the SDK returns only that row ([1, vocab]);
        with it, `[1, T, vocab]`, one row per position up to the largest cache id (base.py `context`, the
        vocabulary possibly padded for tp_degree). A 1-token prompt goes as [token, PAD_ID] with cache ids
        [0, 0] (module docstring), so its last row is position 0."""
        if len(prompt) == 1:
            input_ids = torch.tensor([[prompt[0], PAD_ID]], dtype=torch.long)
            cache_ids = torch.zeros((1, 2), dtype=torch.long)
        else:
            input_ids = torch.tensor([list(prompt)], dtype=torch.long)
            cache_ids = torch.arange(len(prompt), dtype=torch.long)[None, :]
        logits = self._forward(input_ids, cache_ids, torch.tensor([slot], dtype=torch.long))
        rows = logits[0] if logits.dim() == 3 else logits  # [T, vocab_padded] or [1, vocab]
        return rows[: len(prompt), : self.vocab_size] if self.vocab_size else rows[: len(prompt)]

    def _forward(self, input_ids: torch.Tensor, cache_ids: torch.Tensor, start_ids: torch.Tensor) -> torch.Tensor:
        model = self._running_model()
        with torch.inference_mode():
            return model.forward(input_ids, cache_ids=cache_ids, start_ids=start_ids)

    def _warm_up(self) -> str:
        """Per context bucket: a prompt of that length prefilled into slot 0 and one decode step over all
        slots (the others hold 1-token prompts), so that no user request pays a kernel's first run."""
        seed_ids = self.encode("Hello") or [self.tokenizer.eos_token_id or 1]
        filler = tuple(seed_ids[:1])
        self._warm("the other slots' 1-token prompts", [SlotRequest(s, filler) for s in range(1, self.n_slots)])
        for bucket in self.context_buckets:
            length = max(1, min(bucket, self.n_positions - 1))  # room for the decode step's position
            prompt = tuple((seed_ids * length)[:length])
            self._warm(f"context bucket {bucket} ({length} tokens into slot 0)", [SlotRequest(0, prompt)])
            self.release(0)
        buckets = self.context_buckets
        return f"of {len(buckets)} context bucket(s) {buckets} with a decode step over {self.n_slots} slot(s)"

    def _warm(self, what: str, requests: list[SlotRequest]) -> None:
        try:
            self.prefill(requests)
            if 0 in self._live:
                self.decode(sorted(self._live))
        except Exception as exc:
            raise RuntimeError(
                f"neuronx warm-up failed for {what}, decode over {self.n_slots} slot(s): {type(exc).__name__}: {exc}"
            ) from exc
