"""handler/backends/sentence_config.py: a checkpoint's sentence-transformers files decide pooling,
normalisation and the maximum length; what it cannot serve faithfully is refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from handler.backends.sentence_config import read_sentence_config
from handler.errors import ConfigError

TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
DENSE = "sentence_transformers.models.Dense"
NORMALIZE = {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}


def write(folder: Path, modules: list[dict], pooling: dict | None, bert: dict | None = None) -> Path:
    (folder / "modules.json").write_text(json.dumps(modules))
    if pooling is not None:
        (folder / "1_Pooling").mkdir()
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    if bert is not None:
        (folder / "sentence_bert_config.json").write_text(json.dumps(bert))
    return folder


def test_minilm_layout_is_mean_pooling_then_normalize(tmp_path):
    pooling = {"word_embedding_dimension": 384, "pooling_mode_cls_token": False, "pooling_mode_mean_tokens": True}
    config = read_sentence_config(
        write(tmp_path, [TRANSFORMER, POOLING, NORMALIZE], pooling, {"max_seq_length": 256, "do_lower_case": False})
    )
    assert (config.pooling, config.normalize, config.max_seq_length, config.dimension) == ("mean", True, 256, 384)
    assert config.transformer_dir == tmp_path


@pytest.mark.parametrize(
    ("pooling", "mode"),
    [
        ({"pooling_mode_cls_token": True}, "cls"),
        ({"pooling_mode_lasttoken": True}, "lasttoken"),
        ({"pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}, "max"),
        ({"pooling_mode": "lasttoken"}, "lasttoken"),
    ],
)
def test_the_pooling_config_picks_the_mode_and_no_normalize_module_means_none(tmp_path, pooling, mode):
    config = read_sentence_config(write(tmp_path, [TRANSFORMER, POOLING], pooling))
    assert (config.pooling, config.normalize, config.max_seq_length) == (mode, False, None)


def test_an_older_layout_with_the_transformer_in_its_own_folder(tmp_path):
    (tmp_path / "0_Transformer").mkdir()
    (tmp_path / "0_Transformer" / "sentence_bert_config.json").write_text('{"max_seq_length": 128}')
    transformer = {**TRANSFORMER, "path": "0_Transformer"}
    config = read_sentence_config(write(tmp_path, [transformer, POOLING], {"pooling_mode_mean_tokens": True}))
    assert config.transformer_dir == tmp_path / "0_Transformer" and config.max_seq_length == 128


def test_a_plain_checkpoint_gets_mean_pooling_without_normalisation(tmp_path):
    config = read_sentence_config(tmp_path)
    assert (config.pooling, config.normalize, config.transformer_dir) == ("mean", False, tmp_path)


@pytest.mark.parametrize(
    ("modules", "pooling", "match"),
    [
        (
            [
                TRANSFORMER,
                POOLING,
                {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"},
            ],
            {"pooling_mode_mean_tokens": True},
            "module 2 .*Dense.* is not supported",
        ),
        ([TRANSFORMER, POOLING], {"pooling_mode_mean_tokens": True, "pooling_mode_cls_token": True}, "exactly one"),
        ([TRANSFORMER, POOLING], {"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
        ([TRANSFORMER], None, "followed by a Pooling module"),
        ([TRANSFORMER, POOLING], None, "config is missing"),
    ],
)
def test_what_cannot_be_served_faithfully_is_refused(tmp_path, modules, pooling, match):
    with pytest.raises(ConfigError, match=match):
        read_sentence_config(write(tmp_path, modules, pooling))
