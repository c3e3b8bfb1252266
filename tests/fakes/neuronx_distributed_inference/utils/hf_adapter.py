"""Mirrors load_pretrained_config of src/neuronx_distributed_inference/utils/hf_adapter.py
(NxDI 0.8.16251, SDK 2.28 commit cd3abf3).

`load_pretrained_config(model_path_or_name=None, hf_config=None)` returns the hook
`load_config(inference_config)` that InferenceConfig(..., load_config=hook) runs: it reads
the checkpoint's config with AutoConfig.from_pretrained (exactly one of the two arguments,
else ValueError when the hook runs), copies every key of `config.to_dict()` onto the
InferenceConfig (so `_name_or_path`, the path as given, relative or not, ends up in
neuron_config.json and is where load() re-shards from), keeps the checkpoint's
`transformers_version`, and moves the checkpoint's dtype into
`neuron_config.torch_dtype` unless the NeuronConfig was given `torch_dtype` explicitly
(`overrides_torch_dtype`). The HF class's `attribute_map` is copied too.

One shim of the fake: transformers >= 5 (the test venv) keeps rope_theta only inside
`rope_parameters`, where 4.57 (the version NxDI 0.8 pins) has a top-level `rope_theta`; the
fake copies it up so LlamaInferenceConfig's required attribute is there as with 4.57.
`HuggingFaceGenerationAdapter` (HF generate() over static batches) is not faked.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from transformers import AutoConfig, PretrainedConfig

from neuronx_distributed_inference.models.config import to_torch_dtype


def load_pretrained_config(
    model_path_or_name: str | os.PathLike[str] | None = None,
    hf_config: PretrainedConfig | None = None,
) -> Any:
    def load_config(self: Any) -> None:
        if (model_path_or_name is None and hf_config is None) or (
            model_path_or_name is not None and hf_config is not None
        ):
            raise ValueError('Please provide only one of "model_path_or_name" or "hf_config"')
        config = AutoConfig.from_pretrained(model_path_or_name) if model_path_or_name is not None else hf_config
        config_dict = config.to_dict()
        if config.transformers_version is not None:
            config_dict["transformers_version"] = config.transformers_version
        hf_dtype = config_dict.get("dtype", config_dict.get("torch_dtype", None))
        if hf_dtype is not None:
            if self.neuron_config is not None and not self.neuron_config.overrides_torch_dtype:
                self.neuron_config.torch_dtype = hf_dtype
                if isinstance(self.neuron_config.torch_dtype, str):
                    self.neuron_config.torch_dtype = to_torch_dtype(self.neuron_config.torch_dtype)
            config_dict.pop("dtype", None)
            config_dict.pop("torch_dtype", None)
        for key, value in config_dict.items():
            if isinstance(getattr(config, key, None), PretrainedConfig):
                config_dict[key] = SimpleNamespace(**value)
                if config.transformers_version is not None:
                    config_dict[key].transformers_version = config.transformers_version
        rope = config_dict.get("rope_parameters")
        if "rope_theta" not in config_dict and isinstance(rope, dict) and "rope_theta" in rope:
            config_dict["rope_theta"] = rope["rope_theta"]  # the fake's transformers-5 shim (module docstring)
        self.__dict__.update(config_dict)
        if hasattr(config, "attribute_map"):
            self.attribute_map = config.attribute_map

    return load_config
