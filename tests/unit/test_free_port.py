"""free_port (scripts/serve/local_torchserve.py): TorchServe binds its five ports only when it
runs, so the ports named before then must all differ."""

from __future__ import annotations

from scripts.serve.local_torchserve import free_port


def test_no_port_is_handed_out_twice():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
