"""The second frontend: the same engine, routes and wire formats served in-process by uvicorn +
Starlette (docs/frontends.md), no TorchServe and no Java. A request reaches the engine's
scheduler when it arrives and streams its chunks as the steps make them.

It imports the wire formats (handler/api/), the engine and the context-free core
(handler/core/); never the TorchServe adapter (handler/serving/); nothing imports it
(tests/unit/test_layers.py). Start it with `python -m handler.frontend` (`__main__.py`).
"""
