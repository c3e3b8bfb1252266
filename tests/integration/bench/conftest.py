"""A fake clock for the simulated device (tests/support/bench.py)."""

from tests.support.bench import fake_clock

__all__ = ["fake_clock"]
