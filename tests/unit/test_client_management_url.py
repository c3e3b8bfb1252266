"""The key command renews an expired inference key at the running server's management address:
`--management-url` when given, else the `management_address` of the config.properties that
`make serve` wrote (so `make serve MANAGEMENT_PORT=9181` needs no option), else TorchServe's 8081."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx
import pytest

from scripts.serve import client
from scripts.serve.client import DEFAULT_MANAGEMENT_URL, management_url_of, resolve_management_url

REPO = Path(__file__).resolve().parents[2]
EXPIRED = "2000-01-01T00:00:00.000000Z"


def write_properties(path: Path, management: str | None) -> Path:
    lines = ["# as serving/local.properties", "enable_model_api=false", "inference_address=http://127.0.0.1:9180"]
    if management is not None:
        lines.append(f"management_address={management}")
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_explicit_management_url_wins(tmp_path):
    config = write_properties(tmp_path / "config.properties", "http://127.0.0.1:9181")
    assert resolve_management_url("http://10.0.0.5:7777", config) == "http://10.0.0.5:7777"


def test_without_one_the_running_servers_config_names_it(tmp_path):
    config = write_properties(tmp_path / "config.properties", "http://127.0.0.1:9181")
    assert resolve_management_url(None, config) == "http://127.0.0.1:9181"


def test_a_wildcard_bind_address_is_reached_on_loopback(tmp_path):
    ipv4 = write_properties(tmp_path / "v4.properties", "http://0.0.0.0:9181")
    ipv6 = write_properties(tmp_path / "v6.properties", "https://[::]:9181/")
    assert management_url_of(ipv4) == "http://127.0.0.1:9181"
    assert management_url_of(ipv6) == "https://[::1]:9181"


def test_no_config_or_no_address_falls_back_to_torchserves_default(tmp_path):
    assert resolve_management_url(None, tmp_path / "missing.properties") == DEFAULT_MANAGEMENT_URL
    bare = write_properties(tmp_path / "config.properties", None)
    assert resolve_management_url(None, bare) == DEFAULT_MANAGEMENT_URL
    assert resolve_management_url(None, None) == DEFAULT_MANAGEMENT_URL


def test_the_makefile_writes_the_address_the_client_reads(tmp_path):
    """`make serve`'s config.properties (the Makefile's TS_CONFIG), built with other ports."""
    build = tmp_path / "build"
    target = build / "config.properties"
    command = ["make", "-s", "-B", f"BUILD={build}", "MANAGEMENT_PORT=9181", "HOST=127.0.0.1", str(target)]
    subprocess.run(command, cwd=REPO, check=True, capture_output=True)
    assert management_url_of(target) == "http://127.0.0.1:9181"


def test_the_token_command_renews_an_expired_key_at_the_configured_port(tmp_path, monkeypatch, capsys):
    key_file = tmp_path / "key_file.json"
    keys = {
        "management": {"key": "m", "expiration time": EXPIRED},
        "inference": {"key": "old", "expiration time": EXPIRED},
        "API": {"key": "api-key"},
    }
    key_file.write_text(json.dumps(keys))
    config = write_properties(tmp_path / "config.properties", "http://127.0.0.1:9181")
    asked: list[tuple[str, dict, dict]] = []

    def token_api(url: str, params: dict, headers: dict) -> httpx.Response:
        asked.append((url, params, headers))
        renewed = {**keys, "inference": {"key": "new", "expiration time": "2999-01-01T00:00:00Z"}}
        key_file.write_text(json.dumps(renewed))  # TorchServe rewrites the key file
        return httpx.Response(200, json={"token": "new"})

    monkeypatch.setattr(client.httpx, "get", token_api)
    client.main(["--key-file", str(key_file), "--ts-config", str(config), "token"])
    assert capsys.readouterr().out.strip() == "new"
    assert asked == [
        ("http://127.0.0.1:9181/token", {"type": "inference"}, {"Authorization": "Bearer api-key"}),
    ]


@pytest.mark.parametrize("given", [None, "http://127.0.0.1:9999"])
def test_the_option_given_on_the_command_line_still_wins(tmp_path, monkeypatch, given):
    key_file = tmp_path / "key_file.json"
    keys = {"inference": {"key": "old", "expiration time": EXPIRED}, "API": {"key": "api-key"}}
    key_file.write_text(json.dumps(keys))
    config = write_properties(tmp_path / "config.properties", "http://127.0.0.1:9181")
    urls: list[str] = []

    def token_api(url: str, params: dict, headers: dict) -> httpx.Response:
        urls.append(url)
        key_file.write_text(json.dumps({**keys, "inference": {"key": "new"}}))
        return httpx.Response(200)

    monkeypatch.setattr(client.httpx, "get", token_api)
    args = ["--key-file", str(key_file), "--ts-config", str(config)]
    args += ["--management-url", given] if given else []
    client.main([*args, "token"])
    assert urls == [f"{given or 'http://127.0.0.1:9181'}/token"]
