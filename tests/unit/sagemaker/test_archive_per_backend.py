"""`make sagemaker-archive` per backend: the handler's dependencies are bundled for the Python
and glibc of the DLC the config's backend deploys to (neuronx: the SDK 2.25 DLC, CPython 3.10,
Ubuntu 22.04 / glibc 2.35; nxdi: the SDK 2.28 DLC, CPython 3.12, Ubuntu 24.04 / glibc 2.39).

No network: pip itself is replaced by a recorder that leaves a pydantic dist-info where pip
would (test_sagemaker_archive.py runs the real pip for the neuronx DLC)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.sagemaker import archive as sagemaker_archive
from scripts.sagemaker.common import DLCS, REPO, SAGEMAKER_MODEL_CONFIG, dlc_for, manylinux_platforms
from scripts.sagemaker.upload import check_model_folder

NXDI_MODEL_CONFIG = REPO / "configs" / "model-config-sagemaker-inf2-nxdi.yaml"


@pytest.mark.parametrize(
    ("backend", "tag", "python", "glibc"),
    [
        ("neuronx", "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "3.10", "2.35"),
        ("auto", "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "3.10", "2.35"),
        ("hf", "2.7.0-neuronx-py310-sdk2.25.0-ubuntu22.04", "3.10", "2.35"),
        ("nxdi", "2.9.0-neuronx-py312-sdk2.28.0-ubuntu24.04", "3.12", "2.39"),
    ],
)
def test_each_backend_has_its_dlc(backend, tag, python, glibc):
    dlc = dlc_for(backend)
    assert (dlc.tag, dlc.python_version, dlc.glibc) == (tag, python, glibc)
    # the tag names the same Python and Ubuntu (22.04: glibc 2.35; 24.04: glibc 2.39)
    assert f"-py{python.replace('.', '')}-" in dlc.tag
    assert dlc.tag.endswith({"2.35": "ubuntu22.04", "2.39": "ubuntu24.04"}[glibc])


def test_manylinux_tags_go_up_to_the_images_glibc_and_no_further():
    assert manylinux_platforms("2.35") == (
        "manylinux2014_x86_64",
        *(f"manylinux_2_{minor}_x86_64" for minor in range(17, 36)),
    )
    nxdi = manylinux_platforms("2.39")
    assert "manylinux_2_39_x86_64" in nxdi and "manylinux_2_40_x86_64" not in nxdi
    assert "manylinux_2_36_x86_64" not in manylinux_platforms("2.35")
    with pytest.raises(ValueError, match=r"2\.17 or later"):
        manylinux_platforms("2.12")


def options(command: list[str], flag: str) -> list[str]:
    return [command[i + 1] for i, word in enumerate(command) if word == flag]


@pytest.mark.parametrize(
    ("backend", "abi", "newest", "too_new"), [("neuronx", "cp310", 35, 36), ("nxdi", "cp312", 39, 40)]
)
def test_pip_fetches_wheels_for_the_dlcs_python_and_glibc(tmp_path, backend, abi, newest, too_new):
    dlc = DLCS[backend]
    command = sagemaker_archive.pip_target_command(
        Path("requirements-archive.txt"), tmp_path, dlc.python_version, dlc.platforms
    )
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    assert options(command, "--python-version") == [dlc.python_version]
    assert options(command, "--abi") == [abi] and options(command, "--implementation") == ["cp"]
    assert "--only-binary=:all:" in command and options(command, "--target") == [str(tmp_path)]
    platforms = options(command, "--platform")
    assert platforms[0] == "manylinux2014_x86_64" and platforms[-1] == f"manylinux_2_{newest}_x86_64"
    assert f"manylinux_2_{too_new}_x86_64" not in platforms


class PipRecorder:
    """bundle_dependencies without pip: records what it was asked, leaves what pip would."""

    def __init__(self) -> None:
        self.calls: list[tuple[Path, str, tuple[str, ...]]] = []

    def __call__(self, requirements: Path, target: Path, python_version: str, platforms) -> None:
        self.calls.append((target, python_version, tuple(platforms)))
        for rel in ("pydantic-2.14.4.dist-info/METADATA", "pydantic/__init__.py"):  # the archiver copies files
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            (target / rel).write_text("")


@pytest.fixture
def pip(monkeypatch) -> PipRecorder:
    recorder = PipRecorder()
    monkeypatch.setattr(sagemaker_archive, "bundle_dependencies", recorder)
    return recorder


def compiled_checkpoint(tiny_model_dir: Path, root: Path) -> Path:
    """The tiny model with artifacts where both device backends look (neuron_cache/artifacts)."""
    checkpoint = root / "my-llama"
    shutil.copytree(tiny_model_dir, checkpoint)
    artifacts = checkpoint / "neuron_cache" / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "manifest.json").write_text("{}")
    return checkpoint


@pytest.mark.parametrize(
    ("config", "deps", "python", "newest"),
    [(NXDI_MODEL_CONFIG, "cp312", "3.12", "manylinux_2_39_x86_64"), (SAGEMAKER_MODEL_CONFIG, "cp310", "3.10", None)],
    ids=["nxdi", "neuronx"],
)
def test_the_archive_bundles_deps_for_the_configs_backend(tmp_path, tiny_model_dir, pip, config, deps, python, newest):
    checkpoint = compiled_checkpoint(tiny_model_dir, tmp_path)
    folder = sagemaker_archive.build(checkpoint, config, "llama", tmp_path / "build")
    ((target, python_version, platforms),) = pip.calls
    assert python_version == python and platforms[-1] == (newest or "manylinux_2_35_x86_64")
    assert target.name == deps
    assert [p.name for p in (folder / "deps").iterdir()] == [deps]
    assert (folder / "model-config.yaml").read_text() == config.read_text()
    found = check_model_folder(folder)  # the upload's checks agree on the subfolder
    assert (found.errors, found.warnings) == ([], [])


def test_python_version_still_overrides_the_backends(tmp_path, tiny_model_dir, pip, capsys):
    checkpoint = compiled_checkpoint(tiny_model_dir, tmp_path)
    folder = sagemaker_archive.build(checkpoint, NXDI_MODEL_CONFIG, "llama", tmp_path / "build", python_version="3.11")
    ((_, python_version, platforms),) = pip.calls
    assert python_version == "3.11" and platforms == DLCS["nxdi"].platforms
    assert [p.name for p in (folder / "deps").iterdir()] == ["cp311"]
    err = capsys.readouterr().err
    assert "warning: deps for Python 3.11 (deps/cp311)" in err and "runs Python 3.12" in err
    (warning,) = check_model_folder(folder).warnings  # uploadable, with --image-uri
    assert "--image-uri" in warning


def test_the_cli_leaves_the_python_to_the_config_unless_told(monkeypatch, tmp_path):
    calls: list[tuple] = []
    monkeypatch.setattr(sagemaker_archive, "build", lambda *args: calls.append(args) or tmp_path)
    sagemaker_archive.main(["--model-dir", str(tmp_path), "--config", str(NXDI_MODEL_CONFIG)])
    sagemaker_archive.main(["--model-dir", str(tmp_path), "--python-version", "3.11"])
    assert [args[5] for args in calls] == [None, "3.11"]  # python_version: None is the backend's DLC's


# -- LoRA adapters (handler.lora) ---------------------------------------------------------------


def write_adapter(folder: Path, rank: int = 4, q_out: int = 64) -> Path:
    """A PEFT LoRA folder for the tiny model (hidden 64): q_proj of layer 0, rank `rank`; `q_out`
    other than 64 makes one trained on another base. Plus what a training run leaves beside it."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": rank, "target_modules": ["q_proj"]}
    (folder / "adapter_config.json").write_text(json.dumps(config))
    prefix = "base_model.model.model.layers.0.self_attn.q_proj"
    weights = {f"{prefix}.lora_A.weight": torch.ones(rank, 64), f"{prefix}.lora_B.weight": torch.ones(q_out, rank)}
    save_file(weights, str(folder / "adapter_model.safetensors"))
    (folder / "checkpoint-500").mkdir()
    (folder / "checkpoint-500" / "optimizer.pt").write_bytes(b"\x00" * 64)
    return folder


def with_adapters(base: Path, dest: Path, adapters: dict[str, str], **handler: Any) -> Path:
    """`base` (a SageMaker config) with handler.lora.adapters, written to `dest`."""
    raw = yaml.safe_load(base.read_text())
    raw["handler"].update(handler, lora={"adapters": adapters, "max_loras": 2})
    dest.write_text(yaml.safe_dump(raw, sort_keys=False))
    return dest


class NoDepsRecorder:
    """bundle_without_deps without pip: records the pins and where they would go."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[str, ...], Path, str]] = []

    def __call__(self, pins, target: Path, python_version: str, platforms) -> None:
        self.calls.append((tuple(pins), target, python_version))
        (target / "peft").mkdir()
        (target / "peft" / "__init__.py").write_text("")


@pytest.fixture
def no_deps(monkeypatch) -> NoDepsRecorder:
    recorder = NoDepsRecorder()
    monkeypatch.setattr(sagemaker_archive, "bundle_without_deps", recorder)
    return recorder


def test_the_archive_holds_each_adapter_where_the_handler_resolves_it(tmp_path, tiny_model_dir, pip, no_deps):
    """A relative path is read beside the config and lands at that path in the archive (the model folder
    the handler resolves it against); one under /opt/ml/model is the same; one under model/ is the
    checkpoint's. Only the two PEFT files go in. nxdi serves adapters with NxD Inference: no peft."""
    checkpoint = compiled_checkpoint(tiny_model_dir, tmp_path)
    sql = write_adapter(tmp_path / "configs" / "adapters" / "sql")
    support = write_adapter(tmp_path / "configs" / "adapters" / "support")
    legal = write_adapter(checkpoint / "loras" / "legal")
    adapters = {"sql": "adapters/sql", "support": "/opt/ml/model/adapters/support", "legal": "model/loras/legal"}
    config = with_adapters(NXDI_MODEL_CONFIG, tmp_path / "configs" / "nxdi-lora.yaml", adapters)

    folder = sagemaker_archive.build(checkpoint, config, "llama", tmp_path / "build")

    from handler.config import ServingConfig

    served = ServingConfig.from_model_yaml(yaml.safe_load((folder / "model-config.yaml").read_text()))
    paths = served.handler.adapter_paths(folder)  # as the worker resolves them, model_dir = the archive
    paths["support"] = folder / paths["support"].relative_to("/opt/ml/model")  # the endpoint's mount
    for name, source in {"sql": sql, "support": support, "legal": legal}.items():
        for file in ("adapter_config.json", "adapter_model.safetensors"):
            assert (paths[name] / file).read_bytes() == (source / file).read_bytes(), (name, file)
    assert sorted(p.name for p in (folder / "adapters" / "sql").iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]  # a training run's checkpoint-500/ stays out
    assert no_deps.calls == []  # nxdi: no peft
    assert check_model_folder(folder).errors == []


@pytest.mark.parametrize(
    ("python_version", "deps", "pins"),
    [
        (None, "cp310", ("peft==0.15.2", "accelerate==1.7.0")),  # requirements-compat.txt: the SDK 2.25 DLC's stack
        ("3.12", "cp312", ("peft==0.18.1", "accelerate==1.12.0")),  # requirements-py312.txt: the SDK 2.28 DLC's
    ],
)
def test_adapters_on_hf_bring_peft_without_its_dependencies(
    tmp_path, tiny_model_dir, pip, no_deps, python_version, deps, pins
):
    """peft and accelerate with --no-deps, pinned as the tests of that Python ran them: with its
    dependencies pip would bundle PyPI's torch and transformers, first on sys.path, over the DLC's."""
    write_adapter(tmp_path / "adapters" / "sql")
    config = with_adapters(SAGEMAKER_MODEL_CONFIG, tmp_path / "hf-lora.yaml", {"sql": "adapters/sql"}, backend="hf")
    folder = sagemaker_archive.build(tiny_model_dir, config, "llama", tmp_path / "build", python_version=python_version)
    ((bundled_pins, target, python),) = no_deps.calls
    assert bundled_pins == pins and target.name == deps and python == (python_version or "3.10")
    assert (folder / "deps" / deps / "peft" / "__init__.py").is_file()
    assert (folder / "adapters" / "sql" / "adapter_model.safetensors").is_file()

    command = sagemaker_archive.pip_no_deps_command(pins, tmp_path, "3.10", DLCS["neuronx"].platforms)
    assert command[-3:] == ["--no-deps", *pins] and "-r" not in command
    assert options(command, "--python-version") == ["3.10"] and options(command, "--abi") == ["cp310"]


def test_hf_without_adapters_bundles_no_peft(tmp_path, tiny_model_dir, pip, no_deps):
    raw = yaml.safe_load(SAGEMAKER_MODEL_CONFIG.read_text())
    raw["handler"]["backend"] = "hf"
    (tmp_path / "hf.yaml").write_text(yaml.safe_dump(raw))
    sagemaker_archive.build(tiny_model_dir, tmp_path / "hf.yaml", "llama", tmp_path / "build")
    assert no_deps.calls == []


@pytest.mark.parametrize(
    ("path", "words"),
    [
        ("/data/adapters/sql", "/data/adapters/sql is outside the model data: the endpoint has only /opt/ml/model"),
        ("../adapters/sql", "../adapters/sql is not a folder inside the archive"),
        ("/opt/ml/model", "/opt/ml/model is not a folder inside the archive"),
        ("deps/sql", "deps/sql is inside the archive's own deps"),
        ("adapters/missing", "no adapter_config.json or adapter_model.safetensors in"),
        ("model/adapters/sql", "in {model_dir}/adapters/sql"),  # under model/: read from MODEL_DIR, not beside
        ("adapters/rank-32", "rank 32 is above handler.lora.max_lora_rank (16)"),
        ("adapters/other-base", "does not fit the base model"),
    ],
)
def test_an_adapter_the_endpoint_would_not_find_or_load_is_refused_before_building(
    tmp_path, tiny_model_dir, pip, no_deps, path, words
):
    write_adapter(tmp_path / "adapters" / "sql")
    write_adapter(tmp_path / "adapters" / "rank-32", rank=32)
    write_adapter(tmp_path / "adapters" / "other-base", q_out=128)
    config = with_adapters(SAGEMAKER_MODEL_CONFIG, tmp_path / "hf-lora.yaml", {"x": path}, backend="hf")
    with pytest.raises(SystemExit) as info:
        sagemaker_archive.build(tiny_model_dir, config, "llama", tmp_path / "build")
    message = str(info.value)
    assert message.startswith(f"error: {config}: handler.lora.adapters.x: ")
    assert words.format(model_dir=tiny_model_dir) in message
    assert not (tmp_path / "build").exists() and pip.calls == [] and no_deps.calls == []


def test_the_lora_pins_follow_the_python():
    assert sagemaker_archive.lora_pins("3.11") == ["peft==0.15.2", "accelerate==1.7.0"]  # the SDK 2.26.1 DLC
    assert sagemaker_archive.lora_pins("3.13") == ["peft==0.18.1", "accelerate==1.12.0"]
