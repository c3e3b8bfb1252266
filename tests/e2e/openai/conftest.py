"""One real torchserve for the OpenAI client tests of this package (tests/support/openai.py)."""

from tests.support.openai import api_key, openai_base_url, server

__all__ = ["api_key", "openai_base_url", "server"]
