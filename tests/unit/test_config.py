from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from handler.config import ServingConfig
from handler.errors import ConfigError
from handler.request import DecodeRow

REPO = Path(__file__).resolve().parents[2]


def minimal(**handler):
    return {"continuousBatching": True, "batchSize": 4, "handler": {"model_checkpoint_dir": "model", **handler}}


def static(micro_batch_size=1, n_slots=4, batch_size=4):
    return {
        "batchSize": batch_size,
        "handler": {"model_checkpoint_dir": "model"},
        "scheduler": {"mode": "static", "n_slots": n_slots},
        "micro_batching": {"micro_batch_size": micro_batch_size},
    }


def test_shipped_model_config_parses():
    config = ServingConfig.from_model_yaml(yaml.safe_load((REPO / "model-config.yaml").read_text()))
    assert config.handler.backend == "hf"
    assert config.scheduler.mode == "continuous" and config.batch_size >= config.scheduler.total_slots
    assert config.micro_batching.micro_batch_size <= config.scheduler.n_slots  # ready for mode: static


def shipped_generation_configs() -> list[Path]:
    """The shipped LLM configs (an embedding archive's, handler.task embed, has tests/unit/test_embed_config.py)."""
    paths = [REPO / "model-config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]
    return [p for p in paths if (yaml.safe_load(p.read_text())["handler"].get("task") or "generate") == "generate"]


def test_every_shipped_config_serves_continuously():
    for path in shipped_generation_configs():
        config = ServingConfig.from_model_yaml(yaml.safe_load(path.read_text()))
        assert config.scheduler.mode == "continuous", path


def test_defaults_and_immutability():
    config = ServingConfig.from_model_yaml(minimal())
    assert config.handler.amp == "f32"
    assert config.handler.no_route_api == "native"
    assert ServingConfig.from_model_yaml(minimal(no_route_api="tgi")).handler.no_route_api == "tgi"
    assert (config.scheduler.mode, config.scheduler.n_slots, config.scheduler.overlap) == ("continuous", 4, True)
    assert config.scheduler.prefill_token_budget == 2048
    assert config.micro_batching.micro_batch_size == 1
    assert config.micro_batching.parallelism.inference == 1
    # a strict schema at OpenAI's documented limits (5,000 properties, 120,000 characters of names) is ~360 KB
    assert config.handler.grammar.max_constraint_bytes == 512 * 1024
    with pytest.raises(ValidationError):
        config.handler.amp = "bf16"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (minimal(tpdegree=2), "handler.tpdegree: unknown key"),
        (minimal(amp="fp16"), "handler.amp"),
        (minimal(amp="fp16"), "'f32', 'f16' or 'bf16'"),
        (minimal(no_route_api="openai"), "handler.no_route_api"),
        (minimal(tp_degree=0), "handler.tp_degree"),
        (minimal(tp_degree="2"), "handler.tp_degree"),
        (minimal(n_positions=128, max_new_tokens=200, default_max_new_tokens=16), "leaves no room for a prompt"),
        (minimal(default_max_new_tokens=600, max_new_tokens=512), "default_max_new_tokens (600) is above"),
        ({"handler": {}}, "handler.model_checkpoint_dir: required key is missing"),
        ({"batchSize": 4}, "'handler:' section is missing"),
        (static(micro_batch_size=8, n_slots=8), "micro_batch_size (8) is above batchSize (4)"),
        (static(micro_batch_size=8), "micro_batch_size (8) is above scheduler.n_slots (4)"),
        ({**static(), "continuousBatching": True}, "scheduler.mode is 'static' but continuousBatching is true"),
        ({**minimal(), "continuousBatching": False}, "continuousBatching is not true"),
        ({**minimal(), "scheduler": {"n_slots": 8}}, "batchSize (4) is below scheduler.n_slots (8)"),
        ({**minimal(), "scheduler": {"mode": "dynamic"}}, "scheduler.mode"),
        ({**minimal(), "minWorkers": 2, "maxWorkers": 2}, "minWorkers/maxWorkers (2) must be 1"),
        ({**minimal(), "scheduler": {"prefill_token_budget": 0}}, "scheduler.prefill_token_budget"),
        ({**minimal(), "micro_batching": {"parallelism": {"inferense": 1}}}, "micro_batching.parallelism.inferense"),
        ({**minimal(), "batchSize": 0}, "batchSize must be a positive integer"),
        (minimal(grammar={"max_constraint_bytes": 100}), "handler.grammar.max_constraint_bytes"),
        (minimal(grammar={"max_constraint_bytes": "1 MB"}), "handler.grammar.max_constraint_bytes"),
    ],
)
def test_bad_config_names_the_key(raw, expected):
    with pytest.raises(ConfigError) as excinfo:
        ServingConfig.from_model_yaml(raw)
    assert expected in str(excinfo.value)


def test_checkpoint_path_relative_to_archive_or_absolute(tmp_path):
    relative = ServingConfig.from_model_yaml(minimal()).handler
    assert relative.checkpoint_path(tmp_path) == tmp_path / "model"
    absolute = ServingConfig.from_model_yaml(minimal(model_checkpoint_dir="/models/llama")).handler
    assert absolute.checkpoint_path(tmp_path) == Path("/models/llama")


@pytest.mark.parametrize("mode", ["continuous", "static"])
@pytest.mark.parametrize("delay", [0, -5, 2.5])
def test_a_max_batch_delay_torchserve_would_turn_into_100_ms_is_refused(mode, delay):
    raw = {**(minimal() if mode == "continuous" else static()), "maxBatchDelay": delay}
    with pytest.raises(ConfigError, match=r"maxBatchDelay.*100 ms"):
        ServingConfig.from_model_yaml(raw)


def test_no_max_batch_delay_in_continuous_mode_is_a_warning(caplog):
    with caplog.at_level("WARNING"):
        ServingConfig.from_model_yaml(minimal())
    assert "maxBatchDelay: 1" in caplog.text
    caplog.clear()
    ServingConfig.from_model_yaml({**minimal(), "maxBatchDelay": 1})
    ServingConfig.from_model_yaml(static())  # static: TorchServe's 100 ms window is a batch window
    assert "maxBatchDelay" not in caplog.text


def test_every_shipped_config_bounds_its_frontend_queue_from_its_slots():
    for path in shipped_generation_configs():
        config = ServingConfig.from_model_yaml(yaml.safe_load(path.read_text()))
        n_slots = config.scheduler.total_slots
        assert config.job_queue_size is not None, f"{path.name}: set jobQueueSize (TorchServe's default is 100)"
        assert 2 * n_slots <= config.job_queue_size <= 4 * n_slots, path


@pytest.mark.parametrize("size", [0, -1, "16", True, 1.5])
def test_a_job_queue_size_torchserve_would_ignore_is_refused(size):
    with pytest.raises(ConfigError, match=r"jobQueueSize must be a positive integer.*job_queue_size"):
        ServingConfig.from_model_yaml({**minimal(), "jobQueueSize": size})


def test_a_missing_or_oversized_job_queue_is_a_warning(caplog):
    with caplog.at_level("WARNING", logger="handler.config"):
        ServingConfig.from_model_yaml(minimal())
    assert "sets no jobQueueSize" in caplog.text and "jobQueueSize: 16" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="handler.config"):
        assert ServingConfig.from_model_yaml({**minimal(), "jobQueueSize": 16}).job_queue_size == 16
        assert "jobQueueSize" not in caplog.text
        ServingConfig.from_model_yaml({**minimal(), "jobQueueSize": 1000})
    assert "jobQueueSize 1000 is above 32 x the worker's slots (4, replicas x n_slots)" in caplog.text


# -- scheduler.speculation (issue 45) ----------------------------------------------------------
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def test_speculation_is_read_and_off_when_absent():
    assert ServingConfig.from_model_yaml(minimal()).scheduler.speculation is None
    raw = {**minimal(), "scheduler": {"speculation": {**NGRAM, "prompt_lookup_max": 2}}}
    speculation = ServingConfig.from_model_yaml(raw).scheduler.speculation
    assert (speculation.num_speculative_tokens, speculation.prompt_lookup_min, speculation.prompt_lookup_max) == (
        3,
        2,
        2,
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({**static(), "scheduler": {"mode": "static", "speculation": NGRAM}}, "needs scheduler.mode continuous"),
        ({**minimal(backend="neuronx"), "scheduler": {"speculation": NGRAM}}, "backend neuronx does not verify.*nxdi"),
        ({**minimal(backend="nxdi"), "scheduler": {"speculation": NGRAM}}, "set handler.nxdi.speculation instead"),
        ({**minimal(), "scheduler": {"speculation": {**NGRAM, "num_speculative_tokens": 9}}}, "num_speculative_tokens"),
        (
            {**minimal(), "scheduler": {"speculation": {**NGRAM, "prompt_lookup_min": 3, "prompt_lookup_max": 2}}},
            "prompt_lookup_min",
        ),
        ({**minimal(), "scheduler": {"speculation": {"method": "eagle", "num_speculative_tokens": 3}}}, "method"),
    ],
)
def test_speculation_is_refused_where_it_cannot_be_exact(raw, message):
    with pytest.raises(ConfigError, match=message):
        ServingConfig.from_model_yaml(raw)


def test_a_decode_row_carries_fewer_proposals_than_it_may_take_tokens():
    assert DecodeRow(0, 3, proposal=(1, 2)).proposal == (1, 2)
    with pytest.raises(ValueError, match="3 proposed tokens, but the row may take 3"):
        DecodeRow(0, 3, proposal=(1, 2, 3))
