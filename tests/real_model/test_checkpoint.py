"""The converted checkpoint (scripts/model/real_model.py) reads the same on every transformers the
project runs on: the fields each version looks for are there, the GGUF's traces are gone."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from scripts.model.real_model import SMOLLM2

REPO = Path(__file__).resolve().parents[2]


def read(model_dir: Path, name: str) -> dict:
    return json.loads((model_dir / name).read_text(encoding="utf-8"))


def test_config_carries_both_spellings_and_no_quantization(real_model_dir):
    config = read(real_model_dir, "config.json")
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 100000.0
    assert config["torch_dtype"] == config["dtype"] == "float32"
    assert "quantization_config" not in config


def test_tokenizer_config_has_the_chat_template_and_a_class_4x_knows(real_model_dir, real_tokenizer):
    tokenizer_config = read(real_model_dir, "tokenizer_config.json")
    assert tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert "<|im_start|>" in tokenizer_config["chat_template"]
    assert tokenizer_config["model_max_length"] == 8192
    rendered = real_tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert rendered.endswith("<|im_start|>user\nHi<|im_end|>\n")


def test_generation_config_stops_at_im_end(real_model_dir, real_tokenizer):
    generation = read(real_model_dir, "generation_config.json")
    assert generation["eos_token_id"] == real_tokenizer.convert_tokens_to_ids("<|im_end|>") == 2


def test_source_names_the_pinned_wheel_and_the_files_are_world_readable(real_model_dir):
    source = read(real_model_dir, "SOURCE.json")
    assert source["wheel_sha256"] == SMOLLM2.sha256 and source["license"] == "Apache-2.0"
    assert all(path.stat().st_mode & 0o044 == 0o044 for path in real_model_dir.iterdir())


def test_make_model_is_a_no_op_once_the_checkpoint_is_there(real_model_dir):
    result = subprocess.run(["make", "-n", "model"], cwd=REPO, capture_output=True, text=True, check=True)
    assert "scripts.model.real_model" not in result.stdout, result.stdout
