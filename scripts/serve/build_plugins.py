"""Build the TorchServe frontend plugins (serving/plugins: the readiness /ping) into one jar.

TorchServe puts every jar of the folder named by `plugins_path` in config.properties on the
frontend's classpath and loads the endpoints listed under META-INF/services. The plugin is
compiled against the TorchServe wheel's own frontend jar (its `servingsdk` API is the same in
0.11 and 0.12) for Java 11, the oldest Java TorchServe runs on.

    python -m scripts.serve.build_plugins            # -> build/plugins/inf2-serving-plugins.jar

`make plugins`, every local server (scripts/serve/local_torchserve.py) and `make sagemaker-archive`
build it when a source is newer than the jar. Needs a JDK (javac): on Debian/Ubuntu
`apt-get install openjdk-17-jdk-headless`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "serving" / "plugins" / "src" / "main"
PLUGINS_DIR = REPO / "build" / "plugins"  # what plugins_path names: this folder holds only the jar
JAR_NAME = "inf2-serving-plugins.jar"
JDK_PACKAGE = "openjdk-17-jdk-headless"
JAVA_RELEASE = "11"
MANIFEST = "Manifest-Version: 1.0\r\nCreated-By: scripts/serve/build_plugins.py\r\n\r\n"


def frontend_jar() -> Path:
    """The TorchServe wheel's frontend (model-server.jar), which holds the plugin SDK."""
    import ts

    jar = Path(ts.__file__).resolve().parent / "frontend" / "model-server.jar"
    if not jar.exists():
        raise SystemExit(f"TorchServe's frontend jar is missing ({jar}); reinstall torchserve")
    return jar


def source_files() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*") if p.is_file())


def is_stale(jar: Path) -> bool:
    if not jar.exists():
        return True
    built = jar.stat().st_mtime
    return any(source.stat().st_mtime > built for source in source_files())


def build(out_dir: Path = PLUGINS_DIR, force: bool = False) -> Path:
    """The jar in out_dir, compiled again when missing or older than a source."""
    jar = out_dir / JAR_NAME
    if not force and not is_stale(jar):
        return jar
    javac = shutil.which("javac")
    if javac is None:
        raise SystemExit(
            f"javac not found: building the /ping plugin (serving/plugins) needs a JDK; on Debian/Ubuntu "
            f"`apt-get install {JDK_PACKAGE}`"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".plugins-", dir=out_dir.parent) as tmp:
        classes = Path(tmp) / "classes"
        java_sources = [str(p) for p in source_files() if p.suffix == ".java"]
        command = [javac, "--release", JAVA_RELEASE, "-nowarn", "-cp", str(frontend_jar()), "-d", str(classes)]
        done = subprocess.run(command + java_sources, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"javac failed:\n{done.stdout}{done.stderr}")
        resources = SOURCES / "resources"
        staged = Path(tmp) / JAR_NAME
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", MANIFEST)
            for root in (classes, resources):
                for path in sorted(p for p in root.rglob("*") if p.is_file()):
                    archive.write(path, path.relative_to(root).as_posix())
        os.replace(staged, jar)  # atomic: a server starting meanwhile sees the old jar or the new one
    return jar


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=PLUGINS_DIR, help="folder for the jar (plugins_path)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the jar is up to date")
    args = parser.parse_args(argv)
    print(f"plugins: {build(args.out, args.force)}")


if __name__ == "__main__":
    main()
