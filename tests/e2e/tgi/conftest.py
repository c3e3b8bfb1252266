"""A real torchserve per scheduling mode for the TGI client tests (tests/support/tgi.py)."""

from tests.support.tgi import _hub_online, api_key, client, generate_url, server

__all__ = ["_hub_online", "api_key", "client", "generate_url", "server"]
