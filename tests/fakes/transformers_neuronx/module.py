"""Mirrors save_pretrained_split() of src/transformers_neuronx/module.py: a Hugging Face
model written as a `pytorch_model.bin/` folder of one torch.save file per tensor plus
key_to_filename.json (the layout older releases load)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import torch

from transformers_neuronx import _calllog

KEY_TO_FILENAME_JSON = "key_to_filename.json"


def save_pretrained_split(model: Any, save_directory: str | os.PathLike[str]) -> None:
    """The real one calls `model.save_pretrained(dir, save_function=save_split, safe_serialization=False)`,
    so transformers 4.x writes config.json and hands save_split `<dir>/pytorch_model.bin`. transformers 5
    dropped `save_function`; the fake writes the same result directly."""
    _calllog.record("save_pretrained_split", directory=str(save_directory))
    os.makedirs(save_directory, exist_ok=True)
    model.config.save_pretrained(save_directory)
    _save_split(model.state_dict(), os.path.join(save_directory, "pytorch_model.bin"))


def _save_split(state_dict: dict[str, torch.Tensor], save_dir: str | os.PathLike[str]) -> None:
    os.makedirs(save_dir, exist_ok=True)
    names = {key: f"p{i}.{re.sub(r'[^A-Za-z0-9_.]', '_', key)}" for i, key in enumerate(state_dict)}
    with open(os.path.join(save_dir, KEY_TO_FILENAME_JSON), "w") as f:
        json.dump(names, f, indent=2)
    for key, tensor in state_dict.items():
        torch.save(tensor.clone(), os.path.join(save_dir, names[key]))
