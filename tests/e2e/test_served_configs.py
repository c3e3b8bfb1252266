"""Security audit of the served configurations: `make serve`'s (serving/local.properties plus
the Makefile's addresses; the e2e servers run the same file) and the SageMaker container's
(serving/sagemaker.properties; the rest of its checks are in tests/unit/sagemaker/test_config_checks.py).

Each promise is a test: binds, token auth, model API, allowed_urls, request size, safetensors,
trust_remote_code, no pip install at load, the key file's mode, and framing that a request
cannot break.
"""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import httpx
import pytest
import yaml

from scripts.sagemaker.common import SAGEMAKER_PROPERTIES
from scripts.serve.local_torchserve import LOCAL_PROPERTIES, read_properties
from scripts.serve.torchserve_compat import has_secure_defaults
from tests.support.sse import DONE, events

REPO = Path(__file__).resolve().parents[2]
SHIPPED_MODEL_CONFIGS = [REPO / "model-config.yaml", *sorted((REPO / "configs").glob("*.yaml"))]


@pytest.fixture(scope="module")
def make_serve_properties(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The config.properties `make serve` writes, built by the Makefile into a scratch BUILD dir."""
    build = tmp_path_factory.mktemp("make-serve")
    target = build / "config.properties"
    subprocess.run(["make", "-s", "-B", f"BUILD={build}", str(target)], cwd=REPO, check=True)
    return read_properties(target)


def test_make_serve_binds_loopback_only(make_serve_properties):
    for key in ("inference_address", "management_address", "metrics_address"):
        assert make_serve_properties[key].startswith("http://127.0.0.1:"), key


def test_make_serve_keeps_token_auth_and_the_model_api_off(make_serve_properties):
    assert "disable_token_authorization" not in make_serve_properties  # TorchServe 0.12's default: on
    assert make_serve_properties["enable_model_api"] == "false"


def test_make_serve_admits_archives_from_its_model_store_only(make_serve_properties):
    store = (REPO / "model_store").resolve()
    assert make_serve_properties["allowed_urls"] == f"file://{store}/.*"


def test_both_served_configs_limit_requests_and_install_nothing(make_serve_properties):
    sagemaker = read_properties(SAGEMAKER_PROPERTIES)
    for props in (make_serve_properties, sagemaker):
        assert 0 < int(props["max_request_size"]) <= 6 * 1024 * 1024  # at most SageMaker's own 6 MB payload
        assert props["install_py_dep_per_model"] == "false"
        assert props["decode_input_request"] == "false"  # one body rule, whatever the Content-Type
    # SageMaker: IAM (SigV4) guards the endpoint and sends no TorchServe token: auth off there
    assert sagemaker["disable_token_authorization"] == "true" and sagemaker["enable_model_api"] == "false"
    assert sagemaker["allowed_urls"] == "file:///opt/ml/model/.*"


@pytest.mark.parametrize("path", SHIPPED_MODEL_CONFIGS, ids=lambda p: p.name)
def test_shipped_model_configs_trust_no_remote_code(path):
    handler = yaml.safe_load(path.read_text()).get("handler", {})
    assert handler.get("trust_remote_code", False) is False


def test_checkpoints_load_from_safetensors_only():
    """The hf backend and the hf encoder ask transformers for safetensors explicitly (a .bin pickle is refused):
    both load through hf.py's load_model, and the encoder calls from_pretrained nowhere else."""
    hf, encoder = ((REPO / "handler" / "backends" / name).read_text() for name in ("hf.py", "encoder.py"))
    assert "use_safetensors=True" in hf and "load_model(AutoModelForCausalLM" in hf
    assert "load_model(AutoModel," in encoder and "from_pretrained" not in encoder


# -- against a running server (tests/e2e/conftest.py: serving/local.properties) ----------------
def test_an_oversized_request_gets_413_and_the_server_keeps_serving(server):
    limit = int(read_properties(LOCAL_PROPERTIES)["max_request_size"])
    body = {"prompt": "x" * (limit + 1024), "max_new_tokens": 1, "stream": False}
    response = httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 413
    ok = httpx.post(
        server.predictions_url, json={"prompt": "hi", "max_new_tokens": 2, "stream": False}, headers=server.headers
    )
    assert ok.status_code == 200, ok.text


def test_the_key_file_is_readable_by_its_owner_only(server):
    if not has_secure_defaults():  # TorchServe 0.11 has no token authorization and writes no key file
        assert not server.key_file.exists()
        return
    mode = stat.S_IMODE(server.key_file.stat().st_mode)
    assert mode & (stat.S_IRWXG | stat.S_IRWXO) == 0, oct(mode)


INJECTION = '\n\ndata: [DONE]\n\n{"text": "injected", "finish_reason": "stop"}\r\ndata: {"x": 1}\n'


def test_a_crafted_prompt_cannot_add_ndjson_lines(server):
    body = {"prompt": "Hello" + INJECTION, "max_new_tokens": 6, "ignore_eos": True, "stop": [INJECTION]}
    headers = {**server.headers, "X-Request-Id": "audit-1"}
    response = httpx.post(server.predictions_url, json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    lines = [json.loads(line) for line in response.text.splitlines() if line.strip()]
    assert [line.get("finish_reason") for line in lines] == [None] * (len(lines) - 1) + ["length"]
    assert "injected" not in "".join(line.get("text", "") for line in lines)


def test_a_crafted_model_name_stays_inside_its_sse_event(server):
    """A body routed by its shape (no route: SageMaker's clients send any name) is served and echoes
    `model` in every chunk: json-encoded, its newlines cannot start an event. On the named route the
    same name is a 404 model_not_found whose JSON body holds it escaped (issue 42)."""
    body = {"model": "m" + INJECTION, "prompt": "Hello", "max_tokens": 4, "stream": True, "ignore_eos": True}
    response = httpx.post(server.predictions_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 200, response.text
    got = events(response.text)
    assert got[-1] == DONE and DONE not in got[:-1]
    assert all(event["model"] == body["model"] for event in got[:-1])
    if not has_secure_defaults():  # TorchServe 0.11 passes no url_path: every route is routed by its body
        return
    named = httpx.post(f"{server.predictions_url}/1.0/v1/completions", json=body, headers=server.headers, timeout=60)
    assert named.status_code == 404 and "\n" not in named.text.strip()
    assert named.json()["error"]["code"] == "model_not_found"


# -- one body rule on every served config (docs/native.md) -----------------------
@pytest.mark.parametrize("body", ["42", "null", '"Today the weather is"', "Today the weather is"])
def test_the_body_decides_not_the_content_type(server, body):
    """With decode_input_request=false the handler sees the bytes: JSON-typed or not, same answer."""
    answers = []
    for content_type in ("application/json", "text/plain"):
        headers = {**server.headers, "Content-Type": content_type}
        response = httpx.post(server.predictions_url, content=body, headers=headers, timeout=60)
        assert response.status_code == 200, (content_type, response.text)
        answers.append(ndjson_final(response.text))
    assert answers[0] == answers[1]
    if body.startswith('"'):  # the quotes are part of the prompt, not JSON string syntax
        unquoted = httpx.post(server.predictions_url, content=body.strip('"'), headers=server.headers, timeout=60)
        assert ndjson_final(unquoted.text)["usage"]["prompt_tokens"] < answers[0]["usage"]["prompt_tokens"]


def ndjson_final(text: str) -> dict:
    """The last line of a native stream (a plain-text body streams by default)."""
    return json.loads(text.strip().splitlines()[-1])
