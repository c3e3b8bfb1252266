"""Start R replicas for a worker, and the model as the worker sees it then: its facts and
tokenizer (to parse and check requests), with the replicas holding the model copies."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from handler.backends.loader import resolve_auto
from handler.backends.tokenizer import load_tokenizer
from handler.config import ServingConfig
from handler.neuron.cores import CorePlacement, claim, split
from handler.neuron.nxdi_config import device_sampling_refusal
from handler.replicas.protocol import FIELD_ASKS, ReplicaSpec
from handler.replicas.replica_set import ReplicaSet
from handler.request import GenerationRequest

logger = logging.getLogger(__name__)


class ReplicatedModel:
    """What GenerationService reads of a model (as of a Backend), for R replicas: the facts
    replica 0 reported and the tokenizer loaded here. Generation goes through `replicas`."""

    def __init__(self, replicas: ReplicaSet, tokenizer: Any, placement: CorePlacement | None = None) -> None:
        facts = replicas.facts
        assert facts is not None, "the replicas have not started"
        self.replicas = replicas
        self.tokenizer = tokenizer
        self.placement = placement
        self.name = facts.name
        self.n_slots = facts.n_slots
        self.n_positions = facts.n_positions
        self.max_prompt_tokens = facts.max_prompt_tokens
        self.vocab_size = facts.vocab_size
        self.eos_token_ids = facts.eos_token_ids
        self._refusals = facts.logprob_refusals
        self._device_topk = facts.device_sampling_topk
        self._field_refusals = facts.field_refusals
        self._adapter_refusals = facts.adapter_refusals

    def logprobs_refusal(self, logprobs: bool, prompt_logprobs: bool) -> str | None:
        return self._refusals.get((logprobs, prompt_logprobs))

    def request_refusal(self, request: GenerationRequest) -> tuple[str, str] | None:
        """As the replicas' backend answers it: the fields it refused when it started (sim's
        logit_bias, nxdi on-device sampling's penalties, ...), and nxdi's bound on top_k."""
        for name, (_, asks) in FIELD_ASKS.items():
            refusal = self._field_refusals.get(name)
            if refusal is not None and asks(request):
                return refusal
        return None if self._device_topk is None else device_sampling_refusal(request, self._device_topk)

    def runtime_adapter_refusal(self, unload: bool) -> str | None:
        return self._adapter_refusals.get(unload, "the replicas did not say whether they load adapters")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def warmup(self) -> None:
        """Each replica warmed up before it said Ready."""

    def close(self) -> None:
        self.replicas.stop()
        if self.placement is not None:
            self.placement.release()
            self.placement = None


def _share_cpu_threads(config: ServingConfig) -> ServingConfig:
    """hf without handler.cpu_threads: each replica gets its share of the host's cores rather
    than torch's default of all of them (R replicas x all cores would thrash)."""
    handler, count = config.handler, config.scheduler.replicas
    if handler.backend != "hf" or handler.cpu_threads is not None:
        return config
    threads = max(1, (os.cpu_count() or 1) // count)
    logger.info("replicas: hf without handler.cpu_threads: %d torch threads per replica", threads)
    return config.model_copy(update={"handler": handler.model_copy(update={"cpu_threads": threads})})


def start_replicas(
    config: ServingConfig, model_dir: str | Path | None, gpu_id: int | None = None, workers: int = 1
) -> ReplicatedModel:
    """Claim this worker's cores (neuronx: replicas x tp_degree of them, split in runs of
    tp_degree), start the replicas and wait until every one serves."""
    config = resolve_auto(config)  # decided once, here, so that every replica runs the same backend
    config = _share_cpu_threads(config)
    handler, count = config.handler, config.scheduler.replicas
    placement, shares = None, [None] * count
    if handler.backend in ("neuronx", "nxdi"):
        num_cores = (handler.neuronx if handler.backend == "neuronx" else handler.nxdi).num_cores
        placement, within = claim(gpu_id, workers, handler.tp_degree, num_cores, replicas=count)
        shares = split(placement.cores, count, handler.tp_degree)
        logger.info(
            "replicas: NeuronCores %s for this worker (%s, within %s): %s",
            placement.visible_cores,
            placement.how,
            within,
            ", ".join(f"replica {k} {list(cores)}" for k, cores in enumerate(shares)),
        )
    specs = [ReplicaSpec(k, config, None if model_dir is None else str(model_dir), shares[k]) for k in range(count)]
    replicas = ReplicaSet(specs, handler.step_timeout_s)
    started = time.perf_counter()
    try:
        replicas.launch_all()
        tokenizer = load_tokenizer(handler.checkpoint_path(model_dir or "."), handler.trust_remote_code)
    except BaseException:
        replicas.stop()
        if placement is not None:
            placement.release()
        raise
    logger.info(
        "replicas: %d replicas of %s serving after %.1f s", count, handler.backend, time.perf_counter() - started
    )
    return ReplicatedModel(replicas, tokenizer, placement)
