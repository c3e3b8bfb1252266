"""What a local server refuses, on TorchServe 0.12 (secure defaults) and 0.11 (the DLC's, narrowed by us)."""

from __future__ import annotations

import httpx

from scripts.serve.torchserve_compat import has_secure_defaults


def test_registering_a_model_from_a_url_is_refused(server):
    url = f"http://127.0.0.1:{server.management_port}/models"
    response = httpx.post(
        url, params={"url": "http://127.0.0.1:9/evil.mar"}, headers=server.management_headers, timeout=30
    )
    if has_secure_defaults():
        assert response.status_code == 405  # the model API is off
    else:  # 0.11 cannot switch the API off; allowed_urls admits only the model store
        assert response.status_code == 404, response.text
        assert "does not match any allowed URL" in response.text


def test_inference_without_the_key_is_refused_where_torchserve_has_token_auth(server):
    response = httpx.post(server.predictions_url, json={"prompt": "hi", "max_new_tokens": 1}, timeout=30)
    if has_secure_defaults():
        assert response.status_code in (400, 401) and "key" in response.text.lower()
    else:  # TorchServe 0.11 has no token authorization: `make serve` refuses to run there
        assert response.status_code == 200
