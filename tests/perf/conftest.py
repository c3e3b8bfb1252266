"""The perf tier's real-model fixtures (tests/support/real_model.py), for the lm-eval comparison."""

from tests.support.real_model import real_model_dir, real_server

__all__ = ["real_model_dir", "real_server"]
