"""A gRPC client of TorchServe's inference API, built from the interface the installed TorchServe
carries: its jar holds `inference.proto`, compiled here with grpcio-tools (so the client speaks
exactly the frontend's protocol, 0.11 or 0.12)."""

from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import grpc_tools
import ts
from grpc_tools import protoc

JAR = Path(ts.__file__).parent / "frontend" / "model-server.jar"
SERVICE = "InferenceAPIsService"


def inference_modules(workdir: Path) -> tuple[ModuleType, ModuleType]:
    """(inference_pb2, inference_pb2_grpc) compiled from the installed jar's proto into `workdir`."""
    workdir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(JAR) as jar:
        (workdir / "inference.proto").write_bytes(jar.read("proto/inference.proto"))
    google_protos = Path(importlib.import_module("google.rpc.status_pb2").__file__).parents[2]
    bundled = Path(grpc_tools.__file__).parent / "_proto"
    code = protoc.main(
        [
            "protoc",
            f"-I{workdir}",
            f"-I{bundled}",
            f"-I{google_protos}",
            f"--python_out={workdir}",
            f"--grpc_python_out={workdir}",
            str(workdir / "inference.proto"),
        ]
    )
    if code != 0:
        raise RuntimeError(f"protoc failed on {JAR}'s inference.proto (exit {code})")
    sys.path.insert(0, str(workdir))
    try:
        return importlib.import_module("inference_pb2"), importlib.import_module("inference_pb2_grpc")
    finally:
        sys.path.remove(str(workdir))
