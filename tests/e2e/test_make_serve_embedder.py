"""`make serve EMBEDDER=1` (issue 34, item 1): the LLM and the embedding archive side by side in one
real TorchServe, each answering its own routes and refusing the other's with a message naming the
archive that serves it; the closing hints show how to call each."""

from __future__ import annotations

import json
import os
import subprocess

import httpx
import pytest

from scripts.serve.client import inference_key
from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.make_checkout import free_ports, make_checkout, make_command


def test_make_serve_loads_the_llm_and_the_embedder_side_by_side(tiny_model_dir, tiny_encoder_dir, tmp_path):
    if not has_secure_defaults():
        pytest.skip("make serve refuses TorchServe 0.11 (no token authorization)")
    checkout = make_checkout(tmp_path / "checkout")
    ports = free_ports()
    settings = [f"{name}={port}" for name, port in ports.items()]
    settings += [f"MODEL_DIR={tiny_model_dir}", "EMBEDDER=1", f"EMBEDDER_DIR={tiny_encoder_dir}", "DRAIN_GRACE_S=0"]
    make = make_command()
    try:
        served = subprocess.run(
            [*make, "serve", *settings], cwd=checkout, capture_output=True, text=True, timeout=300, env={**os.environ}
        )
        output = served.stdout + served.stderr
        assert served.returncode == 0, output[-2000:]
        assert "model llama answered" in output and "model minilm answered" in output
        assert "Serving llama, minilm on" in output
        assert "/predictions/minilm/1.0/v1/embeddings" in output and "/predictions/llama" in output

        url = f"http://127.0.0.1:{ports['INFERENCE_PORT']}/predictions"
        key = inference_key(checkout / "key_file.json", management_url=None)
        headers = {"Authorization": f"Bearer {key}"}
        completion = httpx.post(
            f"{url}/llama", json={"prompt": "Hello", "max_new_tokens": 3, "stream": False}, headers=headers, timeout=60
        )
        assert completion.status_code == 200, completion.text
        assert completion.json()["usage"]["completion_tokens"] >= 1

        embedding = httpx.post(
            f"{url}/minilm/1.0/v1/embeddings", json={"input": ["one", "two"]}, headers=headers, timeout=60
        )
        assert embedding.status_code == 200, embedding.text
        hidden = json.loads((tiny_encoder_dir / "config.json").read_text())["hidden_size"]
        assert [len(d["embedding"]) for d in embedding.json()["data"]] == [hidden, hidden]

        crossed = httpx.post(f"{url}/llama/1.0/v1/embeddings", json={"input": "one"}, headers=headers, timeout=60)
        assert crossed.status_code == 400 and "handler.task: embed" in crossed.json()["error"]["message"]
    finally:  # never leave it running, whatever happened
        subprocess.run([*make, "stop", "DRAIN_GRACE_S=0"], cwd=checkout, capture_output=True, timeout=120)
