"""`make sagemaker-archive` per backend: the handler's dependencies are bundled for the Python
and glibc of the DLC the config's backend deploys to (neuronx: the SDK 2.25 DLC, CPython 3.10,
Ubuntu 22.04 / glibc 2.35; nxdi: the SDK 2.28 DLC, CPython 3.12, Ubuntu 24.04 / glibc 2.39).

No network: pip itself is replaced by a recorder that leaves a pydantic dist-info where pip
would (test_sagemaker_archive.py runs the real pip for the neuronx DLC)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

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
