"""Mirrors NeuronApplicationBase of src/neuronx_distributed_inference/models/application_base.py
(NxDI 0.8.16251, SDK 2.28 commit cd3abf3): construction, compile(), load(), warmup() and
where the weights come from. Re-implemented on the fake device (models/_device.py).

- `Model(model_path, config=None, neuron_config=None)`: the path gets a trailing slash;
  config None reads `<model_path>/neuron_config.json` with the model's config class
  (FileNotFoundError when missing); a neuron_config replaces config.neuron_config.
- `compile(compiled_model_path, debug=False, pre_shard_weights_hook=None, dry_run=False)`:
  writes neuron_config.json into the folder first, traces every bucket through NxD's
  ModelBuilder (whose trace() rmtree's `BASE_COMPILE_WORK_DIR`, default /tmp/nxd_model/,
  before writing its scratch files there), saves the configs into that scratch folder,
  then model.pt (the fake: a JSON description of what was compiled: programs and their
  input shapes, buckets, batch sizes, tp_degree, dtype, on-device sampling, the model's
  HF config), then - only with save_sharded_checkpoint=True -
  `weights/tp{rank}_sharded_checkpoint.safetensors` for every rank (this needs the
  checkpoint; a compile without it does not read the weights at all).
- `load(compiled_model_path, start_rank_id=None, local_ranks_size=None, skip_warmup=False)`:
  reads model.pt (missing: ValueError "The provided filename ... does not exist", as
  torch.jit.load says); checks no version and does not compare neuron_config.json with
  model.pt; the weights come from weights/tp{rank}_sharded_checkpoint.safetensors when the
  config says save_sharded_checkpoint (a missing file: FileNotFoundError), else they are
  re-sharded now from the checkpoint at `config._name_or_path` (or, when that path does not
  exist, from the compiled folder itself, which holds none: FileNotFoundError "Can not find
  model.safetensors or pytorch_model.bin in ..."); then (unless the config's skip_warmup or
  the skip_warmup argument) warmup() runs every program once on its example inputs, which
  writes into the KV cache (line 0 by the context example, position 1 of every line by the
  token-generation example). A NEURON_RT_VISIBLE_CORES range with fewer cores than the
  world size (tp_degree) fails load (fake runtime error).

With fused speculation the weights are the draft's, read from `fused_spec_config.draft_model_path` as
get_state_dict reads a checkpoint (a folder: its weight files; a file: torch.load; else the HF model by
name) and prefixed `draft_model.`, then the target's, prefixed `target_model.` (application_base.py:
658-671, 733-736): so with save_sharded_checkpoint the draft's weights are in the saved shards, and
without, load() reads the draft folder again. model.pt records `fused_speculation`:
speculation_length, is_eagle3, and the fake draft's rule (`miss_period`, models/_device.py), taken
from the draft config compiled in.

The call log gets `compile` (folder, work dir, buckets, batch sizes, dtype, tp_degree,
sharded files), `shard_checkpoint` (where the weights were read from and why), `load`
(folder, visible cores, weights "presharded" or "resharded", warmup; with fused speculation `draft`,
the fingerprint of the draft weights the device holds) and `warmup`.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from typing import Any

import torch
from neuronx_distributed.trace.model_builder import ModelBuilder, unshard_checkpoint
from safetensors.torch import load_file

from neuronx_distributed_inference import _calllog
from neuronx_distributed_inference.models._device import DEFAULT_MISS_PERIOD, TracedModel
from neuronx_distributed_inference.models.config import InferenceConfig, NeuronConfig, to_dict
from neuronx_distributed_inference.models.model_wrapper import CONTEXT_ENCODING_MODEL_TAG, ModelWrapper
from neuronx_distributed_inference.modules.lora_serving import LoraModelManager

COMPILED_MODEL_FILE_NAME = "model.pt"
logger = logging.getLogger("Neuron")

_NOT_HF_KEYS = {
    "neuron_config",
    "fused_spec_config",
    "metadata",
    "num_cores_per_group",
    "attribute_map",
    "transformers_version",
    "_name_or_path",
    "qkv_bias",
    "o_bias",
}


def normalize_path(path: str | os.PathLike[str]) -> str:
    return os.path.join(os.path.normpath(path), "")


def is_compiled(model_path: str) -> bool:
    return os.path.isfile(model_path + COMPILED_MODEL_FILE_NAME)


def load_state_dict(state_dict_dir: str) -> dict[str, torch.Tensor]:
    """modules/checkpoint.py load_state_dict: the HF weight formats, fastest first."""
    safetensors_file = os.path.join(state_dict_dir, "model.safetensors")
    safetensors_index = os.path.join(state_dict_dir, "model.safetensors.index.json")
    bin_file = os.path.join(state_dict_dir, "pytorch_model.bin")
    bin_index = os.path.join(state_dict_dir, "pytorch_model.bin.index.json")
    if os.path.isfile(safetensors_file):
        return load_file(safetensors_file)
    if os.path.isfile(safetensors_index) or os.path.isfile(bin_index):
        index = safetensors_index if os.path.isfile(safetensors_index) else bin_index
        with open(index, encoding="utf-8") as handle:
            files = sorted(set(json.load(handle)["weight_map"].values()))
        state: dict[str, torch.Tensor] = {}
        for name in files:
            path = os.path.join(state_dict_dir, name)
            state.update(load_file(path) if name.endswith(".safetensors") else torch.load(path, weights_only=True))
        return state
    if os.path.isfile(bin_file):
        return torch.load(bin_file, weights_only=True)
    raise FileNotFoundError(f"Can not find model.safetensors or pytorch_model.bin in {state_dict_dir}")


class NeuronApplicationBase(torch.nn.Module):
    _STATE_DICT_MODEL_PREFIX = "model."
    _NEW_STATE_DICT_MODEL_PREFIX = ""
    _FUSED_PREFIX = ""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        config: InferenceConfig | None = None,
        neuron_config: NeuronConfig | None = None,
    ) -> None:
        super().__init__()
        model_path = normalize_path(model_path)
        if config is None:
            config = self.get_config_cls().load(model_path)
        if neuron_config is not None:
            config.neuron_config = neuron_config
        self.validate_config(config)
        self.config = config
        self.neuron_config = config.neuron_config
        self.fused_spec_config = config.fused_spec_config
        self.on_device_sampling = self.neuron_config.on_device_sampling_config is not None
        self.model_path = model_path
        self.models: list[ModelWrapper] = []
        self.traced_model: TracedModel | None = None
        self.is_compiled = is_compiled(model_path)
        self.is_loaded_to_neuron = False
        self._builder: ModelBuilder | None = None
        if self.neuron_config.lora_config is not None:  # application_base.py:100-101
            self.lora_model_manager = LoraModelManager(self.neuron_config.lora_config)

    @classmethod
    def validate_config(cls, config: InferenceConfig) -> None:
        if not hasattr(config, "neuron_config"):
            raise ValueError("Config must include a NeuronConfig")

    @classmethod
    def get_config_cls(cls) -> type[InferenceConfig]:
        raise NotImplementedError("get_config_cls is not implemented")

    @classmethod
    def get_neuron_config_cls(cls) -> type[NeuronConfig]:
        return cls.get_config_cls().get_neuron_config_cls()

    def get_compiler_args(self) -> str | None:
        return None

    def forward(self, **kwargs: Any) -> Any:
        raise NotImplementedError("forward is not implemented")

    # -- compile ---------------------------------------------------------------------------
    def get_builder(self, debug: bool = False) -> ModelBuilder:
        if self._builder is None:
            base_compile_work_dir = os.environ.get("BASE_COMPILE_WORK_DIR", "/tmp/nxd_model/")
            self._builder = ModelBuilder(
                router=None,
                tp_degree=self.neuron_config.tp_degree,
                pp_degree=self.neuron_config.pp_degree,
                ep_degree=self.neuron_config.ep_degree,
                world_size=self.neuron_config.world_size,
                start_rank_id=self.neuron_config.start_rank_id,
                local_ranks_size=self.neuron_config.local_ranks_size,
                checkpoint_loader=self._fake_sharding_loader,
                compiler_workdir=base_compile_work_dir,
                debug=debug,
                num_cores_per_group=self.config.num_cores_per_group,
                logical_nc_config=self.neuron_config.logical_nc_config,
                weights_to_skip_layout_optimization=self.config.neuron_config.weights_to_skip_layout_optimization,
            )
            for model in self.models:
                self._builder.add(
                    key=model.tag,
                    model_instance=model.get_model_instance(),
                    example_inputs=model.input_generator(),
                    compiler_args=model.compiler_args,
                    bucket_config=model.bucket_config,
                    priority_model_idx=model.priority_model_idx,
                )
        return self._builder

    def _fake_sharding_loader(self) -> dict[str, torch.Tensor]:
        """What NxD shards: the checkpoint, with the LoRA weight stacks added for a LoRA model (NxD's
        `preprocess_checkpoint` calls `model.update_weights_for_lora(checkpoint)` on a model wrapped
        with LoRA, neuronx_distributed trace/trace.py:637-638 at v2.28.0; the fake does it in the loader
        it hands its ModelBuilder)."""
        state = self.checkpoint_loader_fn()
        if self.neuron_config.lora_config is not None:
            state = self.update_weights_for_lora(state)  # type: ignore[attr-defined]  # NeuronBaseForCausalLM's
        return state

    def _save_configs_to_compiler_workdir(self) -> None:
        base_compile_work_dir = self.get_builder().compiler_workdir
        self.config.save(base_compile_work_dir)
        for submodel in self.models:
            for bucket_rank, bucket_size in enumerate(submodel.config.neuron_config.buckets):
                specific = copy.deepcopy(submodel.config)
                specific.neuron_config.buckets = [bucket_size]
                if submodel.tag == CONTEXT_ENCODING_MODEL_TAG:
                    specific.neuron_config.context_encoding_buckets = [bucket_size]
                else:
                    specific.neuron_config.token_generation_buckets = [bucket_size]
                specific.save(os.path.join(base_compile_work_dir, submodel.tag, f"_tp0_bk{bucket_rank}"))

    def compile(
        self,
        compiled_model_path: str | os.PathLike[str],
        debug: bool = False,
        pre_shard_weights_hook: Any = None,
        dry_run: bool = False,
    ) -> None:
        compiled_model_path = normalize_path(compiled_model_path)
        started = time.monotonic()
        self.config.save(compiled_model_path)
        builder = self.get_builder(debug)
        programs = builder.trace(initialize_model_weights=False, dry_run=dry_run)
        self._save_configs_to_compiler_workdir()
        if dry_run:
            return
        TracedModel(self._trace_spec(programs)).save(compiled_model_path + COMPILED_MODEL_FILE_NAME)
        self.shard_weights(compiled_model_path, debug, pre_shard_weights_hook)
        self.is_compiled = True
        _calllog.record(
            "compile",
            cls=type(self).__name__,
            path=compiled_model_path,
            workdir=builder.compiler_workdir,
            buckets={model.tag: list(model.neuron_config.buckets) for model in self.models},
            batch_sizes={model.tag: model.neuron_config.batch_size for model in self.models},
            torch_dtype=str(self.neuron_config.torch_dtype),
            tp_degree=self.neuron_config.tp_degree,
            sharded=bool(self.neuron_config.save_sharded_checkpoint and not self.neuron_config.skip_sharding),
            visible_cores=os.environ.get("NEURON_RT_VISIBLE_CORES"),
            seconds=round(time.monotonic() - started, 3),
        )

    def _trace_spec(self, programs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
        """What model.pt records: the compiled programs and what was traced into them."""
        wrappers = {model.tag: model for model in self.models}
        config_dict = to_dict(self.config)
        hf_config = {key: value for key, value in config_dict.items() if key not in _NOT_HF_KEYS}
        if isinstance(hf_config.get("rope_parameters"), dict) and "rope_theta" in hf_config["rope_parameters"]:
            hf_config.pop("rope_theta", None)  # the transformers-5 shim of hf_adapter, undone
        sampling = self.neuron_config.on_device_sampling_config
        lora_config = self.neuron_config.lora_config
        lora = None
        if lora_config is not None:
            lora = {
                "max_loras": lora_config.max_loras,
                "batch_size": lora_config.batch_size,
                "max_lora_rank": lora_config.max_lora_rank,
                "dynamic_multi_lora": lora_config.dynamic_multi_lora,
                "modules": sorted({m.name.rsplit(".", 1)[0] for m in self.fake_lora_modules()}),
                # the device slots start with the adapters of lora_ckpt_paths, numbered as
                # LoraModelManager numbers them (lora_model.py:440-446): 0, 1, ...
                "device_adapters": list(range(len(lora_config.lora_ckpt_paths))),
            }
        fused = None
        if self.neuron_config.enable_fused_speculation:
            draft_config = self.fused_spec_config.draft_config
            fused = {
                "speculation_length": self.neuron_config.speculation_length,
                "is_eagle3": self.neuron_config.is_eagle3,
                "miss_period": int(getattr(draft_config, "fake_eagle_miss_period", DEFAULT_MISS_PERIOD)),
            }
        return {
            "lora": lora,
            "fused_speculation": fused,
            "format": "fake neuronx_distributed_inference model.pt",
            "model_class": type(self).__name__,
            "programs": {
                tag: [
                    {
                        "bucket": wrappers[tag].neuron_config.buckets[entry["bucket_rank"]],
                        "batch_size": wrappers[tag].neuron_config.batch_size,
                        "input_shapes": entry["input_shapes"],
                        "compiler_args": entry["compiler_args"],
                    }
                    for entry in entries
                ]
                for tag, entries in programs.items()
            },
            "tp_degree": self.neuron_config.tp_degree,
            "world_size": self.neuron_config.world_size,
            "logical_nc_config": self.neuron_config.logical_nc_config,
            "torch_dtype": str(self.neuron_config.torch_dtype).split(".")[-1],
            "max_context_length": self.neuron_config.max_context_length,
            "max_length": self.neuron_config.max_length,
            "kv_cache_batch_size": self.neuron_config.kv_cache_batch_size,
            "is_continuous_batching": self.neuron_config.is_continuous_batching,
            "apply_seq_ids_mask": self.neuron_config.apply_seq_ids_mask,
            "on_device_sampling": to_dict(sampling) if sampling is not None else None,
            "output_logits": self.neuron_config.output_logits,
            "hf_config": hf_config,
        }

    def shard_weights(self, compiled_model_path: str, debug: bool = False, pre_shard_weights_hook: Any = None) -> None:
        compiled_model_path = normalize_path(compiled_model_path)
        if pre_shard_weights_hook:
            pre_shard_weights_hook(self)
        if self.neuron_config.skip_sharding or not self.neuron_config.save_sharded_checkpoint:
            return
        self._shard_reason = "compile"
        sharded_checkpoint_dir = os.path.join(compiled_model_path, "weights/")
        self.get_builder(debug).shard_checkpoint(serialize_path=sharded_checkpoint_dir)
        lora_config = self.neuron_config.lora_config
        if lora_config is not None and lora_config.dynamic_multi_lora:  # application_base.py:256-260
            checkpoint = self.lora_weight_manager.lora_checkpoint
            checkpoint.update_weights_for_lora_cpu(self)
            checkpoint.shard_cpu_checkpoints(
                self.neuron_config.start_rank_id,
                self.neuron_config.local_ranks_size,
                self.neuron_config.tp_degree,
                self,
                serialize_path=sharded_checkpoint_dir,
            )

    # -- load ---------------------------------------------------------------------------
    def load(
        self,
        compiled_model_path: str | os.PathLike[str],
        start_rank_id: int | None = None,
        local_ranks_size: int | None = None,
        skip_warmup: bool = False,
    ) -> None:
        compiled_model_path = normalize_path(compiled_model_path)
        started = time.monotonic()
        self.traced_model = TracedModel.load(compiled_model_path + COMPILED_MODEL_FILE_NAME)
        weights = self.load_weights(compiled_model_path, start_rank_id=start_rank_id, local_ranks_size=local_ranks_size)
        for model_wrapper in self.models:
            model_wrapper.model = self.traced_model
        self.is_loaded_to_neuron = True
        warm = not self.neuron_config.skip_warmup and not skip_warmup
        if warm:
            self.warmup()
        else:
            logger.info("Skipping model warmup")
        _calllog.record(
            "load",
            cls=type(self).__name__,
            path=compiled_model_path,
            weights=weights,
            warmup=warm,
            draft=self.traced_model.draft_fingerprint,
            visible_cores=os.environ.get("NEURON_RT_VISIBLE_CORES"),
            num_cores=os.environ.get("NEURON_RT_NUM_CORES"),
            tp_degree=self.neuron_config.tp_degree,
            seconds=round(time.monotonic() - started, 3),
        )

    def warmup(self) -> None:
        started = time.monotonic()
        runs = 0
        for model in self.models:
            for example in model.input_generator():
                try:
                    model.model(*example)
                    runs += 1
                except RuntimeError as error:  # the real one logs and carries on
                    logger.warning(
                        f"Received a {type(error).__name__} during warmup of a model tagged as {model.tag}. "
                        "This is safe to ignore."
                    )
        if self.traced_model is not None:
            self.traced_model.trace_log.clear()
        _calllog.record("warmup", runs=runs, seconds=round(time.monotonic() - started, 3))

    def load_weights(
        self, compiled_model_path: str, start_rank_id: int | None = None, local_ranks_size: int | None = None
    ) -> str:
        compiled_model_path = normalize_path(compiled_model_path)
        if self.traced_model is None:
            raise ValueError("Model is not loaded")
        if start_rank_id is None:
            start_rank_id = self.neuron_config.start_rank_id
        if local_ranks_size is None:
            local_ranks_size = self.neuron_config.local_ranks_size
        if start_rank_id != 0 or local_ranks_size != self.neuron_config.tp_degree:
            raise NotImplementedError("fake NxD Inference: only a single-node load of every tp rank is modelled")
        lora_config = self.neuron_config.lora_config
        dynamic = lora_config is not None and lora_config.dynamic_multi_lora
        lora_cpu_weights: list[dict[str, Any]] = []
        if self.neuron_config.save_sharded_checkpoint:
            shards = [
                load_file(os.path.join(compiled_model_path, f"weights/tp{rank}_sharded_checkpoint.safetensors"))
                for rank in range(start_rank_id, start_rank_id + local_ranks_size)
            ]
            source = "presharded"
            if dynamic:  # application_base.py:400-401
                lora_cpu_weights = self.lora_model_manager.lora_checkpoint.load_sharded_cpu_checkpoints(
                    compiled_model_path, start_rank_id, local_ranks_size
                )
        else:
            self._shard_reason = "load"
            shards = self.get_builder().shard_checkpoint()
            source = "resharded"
            if dynamic:  # application_base.py:407-411
                checkpoint = self.lora_weight_manager.lora_checkpoint
                checkpoint.update_weights_for_lora_cpu(self)
                lora_cpu_weights = checkpoint.shard_cpu_checkpoints(
                    start_rank_id, local_ranks_size, self.neuron_config.tp_degree, self
                )
        self.traced_model.initialize(unshard_checkpoint(shards))
        if dynamic:  # application_base.py:416-417
            self.lora_model_manager.init_dynamic_multi_lora(lora_cpu_weights)
        return source

    def checkpoint_loader_fn(self, mmap: bool = False) -> dict[str, torch.Tensor]:
        """The weights from the HF checkpoint at config._name_or_path, or from model_path when that path
        does not exist; 'model.' prefixes stripped as get_state_dict does. (The real one also casts to
        torch_dtype; the fake keeps float32, its device runs in float32.)"""
        model_path = getattr(self.config, "_name_or_path", None)
        if model_path is None or not os.path.exists(model_path):
            model_path = self.model_path
        if self.neuron_config.quantized:
            raise NotImplementedError("fake NxD Inference: quantized checkpoints are not modelled")
        _calllog.record("shard_checkpoint", source=str(model_path), reason=getattr(self, "_shard_reason", None))
        if self.neuron_config.enable_fused_speculation:  # application_base.py:658-671
            fused = self.fused_spec_config
            assert fused is not None
            state = self._fake_state_dict(fused.draft_model_path, fused.draft_config, "draft_model")
            state.update(self._fake_state_dict(model_path, self.config, "target_model"))
            return state
        return self._fake_state_dict(model_path, self.config, "")

    def _fake_state_dict(self, path: str, config: InferenceConfig, prefix: str) -> dict[str, torch.Tensor]:
        """get_state_dict (application_base.py:690-737): 'model.' prefixes stripped, `prefix.` added."""
        if os.path.isdir(path):
            state = load_state_dict(path)
        elif os.path.isfile(path):
            state = torch.load(path, weights_only=True)
        else:
            state = self.load_hf_model(path).state_dict()  # type: ignore[attr-defined]  # OSError for a bad name
        renamed = {}
        for name, tensor in state.items():
            if name.startswith(self._STATE_DICT_MODEL_PREFIX):
                name = self._NEW_STATE_DICT_MODEL_PREFIX + name[len(self._STATE_DICT_MODEL_PREFIX) :]
            renamed[name] = tensor
        converted = self.convert_hf_to_neuron_state_dict(renamed, config)
        return {f"{prefix}.{name}" if prefix else name: tensor for name, tensor in converted.items()}

    @staticmethod
    def convert_hf_to_neuron_state_dict(state_dict: dict[str, torch.Tensor], config: InferenceConfig) -> dict:
        return state_dict

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def reset(self) -> None:
        pass
