"""The inference key expires (TorchServe's `token_expiration_min`); the command the README gives for
the key, and the documented health probe, renew it through TorchServe's token API, so a server keeps
answering for as long as it runs. TorchServe 0.12 only: 0.11 has no token authorization."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from scripts.serve.torchserve_compat import has_secure_defaults
from tests.e2e.conftest import E2E_MODEL_CONFIG
from tests.support.modes import with_mode
from tests.support.torchserve_process import TorchServe, start_torchserve

REPO = Path(__file__).resolve().parents[2]
EXPIRY_MIN = 0.25  # TorchServe reads token_expiration_min as a Double: 15 s, not the suite's minute

pytestmark = pytest.mark.skipif(not has_secure_defaults(), reason="TorchServe 0.11 has no token authorization")


@pytest.fixture(scope="module")
def short_lived(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TorchServe]:
    workdir = tmp_path_factory.mktemp("torchserve-token-expiry")
    ts = start_torchserve(
        workdir,
        tiny_model_dir,
        with_mode(E2E_MODEL_CONFIG, "continuous"),
        extra_properties={"token_expiration_min": str(EXPIRY_MIN)},
    )
    try:
        yield ts
    finally:
        ts.stop()


def client(server: TorchServe, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "scripts.serve.client", "--url", server.url, "--model", server.model_name]
    command += ["--key-file", str(server.key_file)]
    command += ["--management-url", f"http://127.0.0.1:{server.management_port}", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)


def test_an_expired_key_is_renewed_by_the_token_command_and_the_probe(short_lived: TorchServe):
    old = json.loads(short_lived.key_file.read_text())["inference"]["key"]
    time.sleep(EXPIRY_MIN * 60 + 2)
    stale = httpx.get(f"{short_lived.url}/ping", headers={"Authorization": f"Bearer {old}"}, timeout=10)
    assert stale.status_code in (400, 401), stale.text  # TorchServe refuses the expired key
    probe = client(short_lived, "ping")  # the documented exec probe renews, then asks
    assert probe.returncode == 0, probe.stdout + probe.stderr
    token = client(short_lived, "token")
    assert token.returncode == 0, token.stderr
    fresh = token.stdout.strip()
    assert fresh and fresh != old
    body = {"prompt": "Today the weather is", "max_new_tokens": 3, "stream": False}
    reply = httpx.post(short_lived.predictions_url, json=body, headers={"Authorization": f"Bearer {fresh}"}, timeout=30)
    assert reply.status_code == 200, reply.text
