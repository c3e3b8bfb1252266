"""free_port (scripts/serve/local_torchserve.py): TorchServe binds its five ports only when it
runs, so the ports named before then must all differ, also between pytest-xdist workers."""

from __future__ import annotations

import pytest

from scripts.serve.local_torchserve import free_port


def test_no_port_is_handed_out_twice():
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)


@pytest.mark.parametrize("worker", [0, 1, 2])
def test_each_xdist_worker_takes_the_ports_of_its_own_residue(monkeypatch, worker):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "3")
    assert {free_port() % 3 for _ in range(20)} == {worker}
