"""The tests' handle on a real torchserve (implemented in scripts/serve/local_torchserve.py,
which the benchmark uses too)."""

from scripts.serve.local_torchserve import TorchServe, build_archive, copy_logs_on_failure, free_port, start_torchserve

__all__ = ["TorchServe", "build_archive", "copy_logs_on_failure", "free_port", "start_torchserve"]
