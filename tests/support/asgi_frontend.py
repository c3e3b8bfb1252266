"""The tests' handle on a real ASGI frontend (implemented in scripts/serve/local_asgi.py, which the
benchmarks use too)."""

from scripts.serve.local_asgi import ASGI, AsgiFrontend, asgi_model_config, running_asgi_frontend, start_asgi_frontend

__all__ = ["ASGI", "AsgiFrontend", "asgi_model_config", "running_asgi_frontend", "start_asgi_frontend"]
