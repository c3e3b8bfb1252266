"""The handler in-process with the OpenAI routes (tests/support/openai.py)."""

from tests.support.openai import call, served

__all__ = ["call", "served"]
