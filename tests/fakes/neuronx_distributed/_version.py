"""Mirrors src/neuronx_distributed/_version.py at tag v2.28.0: the source version, not the
build number the SDK's wheel carries (0.17.26814)."""

__version__ = "0.17.0"
