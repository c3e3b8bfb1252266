"""`make sagemaker-archive` / `make sagemaker-upload`: what would be uploaded is the user's
checkpoint and SageMaker config with the handler's dependencies bundled for the DLC's Python
3.10, in its own folder; the tiny default model is refused; the local archive is left alone.

The make targets run for real (pip fetches the dependency wheels from PyPI or pip's
configured index); `-o <venv>/.installed` keeps make from (re)installing the venv."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from scripts.sagemaker.common import SAGEMAKER_MODEL_CONFIG, SAGEMAKER_PROPERTIES
from scripts.sagemaker.upload import check_model_folder
from scripts.serve.stage_archive import stage_code

REPO = Path(__file__).resolve().parents[3]
VENV = Path(sys.prefix)
PYTHON_310 = Path.home() / ".pyenv" / "versions" / "3.10.13" / "bin" / "python"


def make(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    command = ["make", "--no-print-directory", "-o", f"{VENV}/.installed", f"VENV={VENV}", *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env={**os.environ}, timeout=600)


@dataclass(frozen=True)
class Built:
    checkpoint: Path
    config: Path
    build: Path
    local_store: Path
    folder: Path


@pytest.fixture(scope="module")
def built(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Built:
    """`make sagemaker-archive` on a user's checkpoint (the tiny model plus compiled artifacts,
    as `make compile` leaves them) and a user's copy of the SageMaker config."""
    root = tmp_path_factory.mktemp("sagemaker-archive")
    checkpoint = root / "my-llama"
    shutil.copytree(tiny_model_dir, checkpoint)
    artifacts = checkpoint / "neuron_cache" / "artifacts"
    artifacts.mkdir(parents=True)
    (artifacts / "manifest.json").write_text('{"tp_degree": 2}')
    (artifacts / "0123abcd.neff").write_bytes(b"\x00NEFF")
    (checkpoint / ".cache" / "huggingface").mkdir(parents=True)  # download metadata: left out
    (checkpoint / ".cache" / "huggingface" / "download.lock").write_text("")
    config = root / "my-sagemaker-config.yaml"
    config.write_text(SAGEMAKER_MODEL_CONFIG.read_text().replace("maxBatchDelay: 50", "maxBatchDelay: 30"))
    local_store = root / "local-model-store"
    (local_store / "llama").mkdir(parents=True)
    (local_store / "llama" / "sentinel").write_text("the local archive")
    build = root / "build"
    result = make(
        "sagemaker-archive",
        f"MODEL_DIR={checkpoint}",
        f"SAGEMAKER_MODEL_CONFIG={config}",
        f"BUILD={build}",
        f"MODEL_STORE={local_store}",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    folder = Path(re.search(r"sagemaker archive: (\S+)", result.stdout)[1])
    return Built(checkpoint, config, build, local_store, folder)


def upload_folder(built: Built) -> Path:
    """The --model-dir that `make sagemaker-upload` hands to scripts/sagemaker/upload.py."""
    result = make(
        "-n",
        "sagemaker-upload",
        f"MODEL_DIR={built.checkpoint}",
        f"SAGEMAKER_MODEL_CONFIG={built.config}",
        f"BUILD={built.build}",
        "SAGEMAKER_S3_URI=s3://my-bucket/llama-inf2/",
    )
    assert result.returncode == 0, result.stderr
    (line,) = [line for line in result.stdout.splitlines() if "scripts.sagemaker.upload" in line]
    words = shlex.split(line)
    return REPO / words[words.index("--model-dir") + 1]


def test_sagemaker_upload_sends_the_folder_sagemaker_archive_built(built):
    assert upload_folder(built).resolve() == built.folder.resolve()
    assert built.folder.is_relative_to(built.build / "sagemaker")


def test_the_archive_is_a_torchserve_model_folder(built):
    manifest = json.loads((built.folder / "MAR-INF" / "MANIFEST.json").read_text())
    assert manifest["model"]["handler"] == "inf2_handler.py"
    assert manifest["model"]["configFile"] == "model-config.yaml"
    assert (built.folder / "inf2_handler.py").is_file()
    assert (built.folder / "handler" / "serving" / "service.py").is_file()


def test_the_archive_holds_the_users_checkpoint_and_artifacts(built):
    expected = {
        p.relative_to(built.checkpoint)
        for p in built.checkpoint.rglob("*")
        if p.is_file() and not p.relative_to(built.checkpoint).parts[0].startswith(".")
    }
    embedded = {p.relative_to(built.folder / "model") for p in (built.folder / "model").rglob("*") if p.is_file()}
    assert embedded == expected
    assert Path("neuron_cache/artifacts/0123abcd.neff") in embedded and Path("model.safetensors") in embedded
    for rel in expected:
        assert (built.folder / "model" / rel).read_bytes() == (built.checkpoint / rel).read_bytes(), rel


def test_the_archive_config_is_the_users_sagemaker_config(built):
    assert (built.folder / "model-config.yaml").read_text() == built.config.read_text()


def test_the_archive_carries_the_container_properties(built):
    assert (built.folder / "sagemaker.properties").read_text() == SAGEMAKER_PROPERTIES.read_text()


def test_the_archive_carries_the_readiness_plugin(built):
    (jar,) = (built.folder / "plugins").iterdir()  # plugins_path=/opt/ml/model/plugins
    assert jar.name == "inf2-serving-plugins.jar"
    assert jar.read_bytes() == (built.build / "plugins" / jar.name).read_bytes()  # what `make plugins` built


def test_the_upload_checks_pass_on_it(built):
    found = check_model_folder(built.folder)
    assert (found.errors, found.warnings) == ([], [])


def test_the_local_archive_is_left_alone(built):
    assert [p.name for p in built.local_store.rglob("*")] == ["llama", "sentinel"]


def test_dependencies_are_bundled_for_the_dlcs_python_3_10(built):
    assert [p.name for p in (built.folder / "deps").iterdir()] == ["cp310"]  # one folder per Python
    deps = built.folder / "deps" / "cp310"
    assert [p.name for p in deps.glob("pydantic-*.dist-info")] == ["pydantic-2.14.4.dist-info"]
    (extension,) = (deps / "pydantic_core").glob("_pydantic_core.*.so")
    assert extension.name == "_pydantic_core.cpython-310-x86_64-linux-gnu.so"
    assert not (built.folder / "requirements.txt").exists()  # nothing for TorchServe to pip-install


@pytest.mark.skipif(not PYTHON_310.exists(), reason=f"no Python 3.10 interpreter at {PYTHON_310}")
def test_the_bundled_deps_import_under_python_3_10_without_site_packages(built):
    """What the handler gets after putting deps/cp310 first on sys.path, on a Python without pydantic."""
    deps = built.folder / "deps" / "cp310"
    code = "\n".join(
        [
            "import sys",
            f"sys.path.insert(0, {str(deps)!r})",
            "from pydantic import BaseModel, ConfigDict, Field",
            "import pydantic",
            "class Section(BaseModel):",
            "    model_config = ConfigDict(extra='forbid', frozen=True, strict=True)",
            "    tp_degree: int = Field(default=1, ge=1)",
            "assert Section.model_validate({'tp_degree': 2}).tp_degree == 2",
            "print(pydantic.VERSION, pydantic.__file__, sys.version_info[:2])",
        ]
    )
    result = subprocess.run([str(PYTHON_310), "-I", "-S", "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    version, location, python = result.stdout.split(" ", 2)
    assert version == "2.14.4" and location.startswith(str(deps)) and python.strip() == "(3, 10)"


@pytest.mark.skipif(
    sys.version_info[:2] != (3, 10), reason="the bundle is for the DLC's Python 3.10: run it in .venv-compat"
)
def test_the_handler_entry_takes_pydantic_from_the_bundled_deps(built):
    """In the DLC nothing pip-installs pydantic (install_py_dep_per_model=false): the archive's
    inf2_handler.py must put deps/cp310 first on sys.path before anything imports pydantic, so
    the worker runs the bundled pydantic whatever the image has (this venv has its own too)."""
    code = "\n".join(
        [
            "import sys",
            f"sys.path.insert(0, {str(built.folder)!r})",  # the worker imports the entry from the model folder
            "import inf2_handler",
            "print(sys.modules['pydantic'].__file__)",
        ]
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=built.folder,
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().startswith(str(built.folder / "deps" / "cp310")), result.stdout


TINY_SPELLINGS = ["models/tiny-llama", "./models/tiny-llama", str(REPO / "models/tiny-llama")]


@pytest.mark.parametrize("model_dir", TINY_SPELLINGS)
@pytest.mark.parametrize("target", ["sagemaker-archive", "sagemaker-upload"])
def test_the_tiny_model_is_refused(tmp_path, target, model_dir):
    args = [target, f"BUILD={tmp_path / 'build'}", "SAGEMAKER_S3_URI=s3://my-bucket/llama-inf2/"]
    result = make(*args, *([f"MODEL_DIR={model_dir}"] if model_dir else []))
    assert result.returncode != 0
    assert "MODEL_DIR is the tiny test model" in result.stderr and "SAGEMAKER_ALLOW_TINY_MODEL=1" in result.stderr
    assert not (tmp_path / "build").exists()  # refused before anything was built


def test_an_upload_without_destination_fails_before_building(tmp_path, built):
    result = make("sagemaker-upload", f"MODEL_DIR={built.checkpoint}", f"BUILD={tmp_path / 'build'}")
    assert result.returncode != 0 and "set SAGEMAKER_S3_URI" in result.stderr
    assert not (tmp_path / "build").exists()


def test_a_checkpoint_without_compiled_artifacts_is_refused(tmp_path, tiny_model_dir):
    """compile_on_start: false in the SageMaker config: a load without artifacts would fail on the endpoint."""
    result = make("sagemaker-archive", f"MODEL_DIR={tiny_model_dir}", f"BUILD={tmp_path / 'build'}")
    assert result.returncode != 0
    assert "no compiled Neuron artifacts" in result.stderr and "make compile" in result.stderr
    assert not (tmp_path / "build").exists()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('  model_checkpoint_dir: "model"   # in the archive', '  model_checkpoint_dir: "model"   # in the archive'),
        ("  model_checkpoint_dir: /models/llama-2-7b  # mine", '  model_checkpoint_dir: "model"  # mine'),
        ("  model_checkpoint_dir: weights", '  model_checkpoint_dir: "model"'),
    ],
)
def test_the_staged_config_points_at_the_embedded_checkpoint_and_keeps_the_rest(tmp_path, line, expected):
    config = tmp_path / "config.yaml"
    config.write_text(f"batchSize: 4\nhandler:\n{line}\n  backend: neuronx\n")
    stage_code(config, tmp_path / "stage", "model")
    assert (tmp_path / "stage" / "model-config.yaml").read_text() == (
        f"batchSize: 4\nhandler:\n{expected}\n  backend: neuronx\n"
    )
