"""A small client for the running server: wait until the model answers, or stream a prompt.

TorchServe's token authorization is on by default; the key is read from the
key_file.json TorchServe writes into the directory it was started from. An expired key is
renewed through the management API: at --management-url, else at the management_address of
the build/config.properties that `make serve` wrote (--ts-config), else on port 8081.

    python -m scripts.serve.client generate "Today the weather is" --max-new-tokens 64
    python -m scripts.serve.client wait --timeout 120
    python -m scripts.serve.client token          # prints the inference key (for curl), renewed when expired
    python -m scripts.serve.client worker-error   # why the worker failed, from logs/model_log.log
    python -m scripts.serve.client ping           # readiness with the key: exit 0 on 200 (an exec probe)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import yaml

from scripts.serve.worker_log import failure_cause

DEFAULT_MANAGEMENT_URL = "http://127.0.0.1:8081"
# The config.properties `make serve` wrote (the Makefile's $(TS_CONFIG)): without --management-url the
# key is renewed at its management_address, so `make serve MANAGEMENT_PORT=...` needs no option here.
DEFAULT_TS_CONFIG = Path("build/config.properties")
# A key this close to its expiry is renewed first: a command that reads it must still find it valid.
RENEW_BEFORE_S = 60.0


def inference_key(key_file: Path, management_url: str | None = DEFAULT_MANAGEMENT_URL) -> str | None:
    """The inference key, or None when TorchServe runs with token auth disabled. A key that expired
    (TorchServe's `token_expiration_min`, 60 by default) or is about to is renewed first through
    TorchServe's token API, with the key file's API key (which does not expire); TorchServe then
    rewrites the key file. `management_url` None: read the file only."""
    if not key_file.exists():
        return None
    keys = _read_keys(key_file)
    if management_url is not None and _expires_within(keys["inference"].get("expiration time"), RENEW_BEFORE_S):
        renew_inference_key(management_url, keys["API"]["key"])
        keys = _read_keys(key_file)
    return keys["inference"]["key"]


def properties(path: Path) -> dict[str, str]:
    """A Java .properties file's `key=value` (or `key: value`) lines; {} when it cannot be read."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    found = {}
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, _, value = line.partition("=") if "=" in line else line.partition(":")
        found[key.strip()] = value.strip()
    return found


def management_url_of(ts_config: Path) -> str | None:
    """The management address a TorchServe config.properties names, to call from this host (a
    wildcard bind address is reached on loopback); None when it names none."""
    address = properties(ts_config).get("management_address")
    if not address:
        return None
    loopback = {"0.0.0.0": "127.0.0.1", "[::]": "[::1]"}
    address = re.sub(r"^(https?://)(0\.0\.0\.0|\[::\])(?=[:/]|$)", lambda m: m[1] + loopback[m[2]], address)
    return address.rstrip("/")


def resolve_management_url(explicit: str | None, ts_config: Path | None = DEFAULT_TS_CONFIG) -> str:
    """--management-url when given, else the running server's (ts_config's management_address),
    else TorchServe's default port."""
    if explicit:
        return explicit
    found = management_url_of(ts_config) if ts_config is not None else None
    return found or DEFAULT_MANAGEMENT_URL


def _read_keys(key_file: Path, attempts: int = 40, pause_s: float = 0.05) -> dict:
    """key_file.json as TorchServe wrote it. TorchServe creates the file, then writes it (at start,
    and again when a key is renewed): a read in between finds it empty or cut short, so read again."""
    for attempt in range(attempts):
        try:
            keys = json.loads(key_file.read_text())
            if isinstance(keys, dict) and "inference" in keys:
                return keys
        except (json.JSONDecodeError, OSError):
            if attempt == attempts - 1:
                raise
        time.sleep(pause_s)
    raise ValueError(f"{key_file} holds no inference key")


def renew_inference_key(management_url: str, api_key: str) -> None:
    """`GET <management>/token?type=inference` with the API key: TorchServe replaces the inference
    key in key_file.json with a new one and a new expiry."""
    response = httpx.get(
        f"{management_url}/token", params={"type": "inference"}, headers={"Authorization": f"Bearer {api_key}"}
    )
    if response.status_code != 200:
        raise SystemExit(f"renewing the inference key failed: HTTP {response.status_code}: {response.text.strip()}")


def _expires_within(stamp: str | None, seconds: float) -> bool:
    """Whether TorchServe's `expiration time` (an ISO instant such as 2024-02-16T21:12:24.801148Z) is
    less than `seconds` away. Python 3.10's fromisoformat takes neither `Z` nor 9 fraction digits."""
    if not stamp:
        return False
    match = re.fullmatch(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?Z?", stamp.strip())
    if match is None:
        return False
    moment = datetime.fromisoformat(match.group(1)).replace(tzinfo=timezone.utc)
    fraction = float(f"0.{match.group(2)}") if match.group(2) else 0.0
    left = moment.timestamp() + fraction - time.time()
    return left < seconds


def auth_headers(key_file: Path, management_url: str | None = DEFAULT_MANAGEMENT_URL) -> dict[str, str]:
    key = inference_key(key_file, management_url)
    return {"Authorization": f"Bearer {key}"} if key else {}


def stream_generate(url: str, body: dict, headers: dict[str, str], timeout: float = 300.0):
    """Yield each NDJSON object of a streamed generation as it arrives."""
    with httpx.stream("POST", url, json=body, headers=headers, timeout=timeout) as response:
        if response.status_code != 200:
            response.read()
            raise SystemExit(f"HTTP {response.status_code}: {response.text}")
        for line in response.iter_lines():
            if line:
                yield json.loads(line)


def readiness_body(task: str = "generate") -> dict[str, Any]:
    """The smallest request an archive of `handler.task` answers 200: one generated token, or one
    embedded word (an embedding archive refuses generation fields with a 400)."""
    if task == "embed":
        return {"inputs": "ping"}
    return {"prompt": "ping", "max_new_tokens": 1, "stream": False}


def task_of(model_config: Path | None) -> str:
    """`handler.task` of a model-config.yaml (generate when unset or unreadable)."""
    if model_config is None:
        return "generate"
    try:
        handler = (yaml.safe_load(model_config.read_text()) or {}).get("handler") or {}
    except (OSError, yaml.YAMLError):
        return "generate"
    return "embed" if handler.get("task") == "embed" else "generate"


def wait_ready(
    url: str,
    key_file: Path,
    timeout: float,
    log: Path | None = None,
    pid_file: Path | None = None,
    management_url: str | None = DEFAULT_MANAGEMENT_URL,
    task: str = "generate",
) -> float:
    """Poll with a one-token request (one embedded word for `task` embed) until the model answers
    200; return seconds waited.

    Gives up early when the TorchServe log shows the model failing to load, or when the
    TorchServe process is gone (e.g. a port was already taken).
    """
    started = time.monotonic()
    log_start = log.stat().st_size if log and log.exists() else 0
    body = readiness_body(task)
    last = "no answer yet"
    while time.monotonic() - started < timeout:
        try:
            response = httpx.post(url, json=body, headers=auth_headers(key_file, management_url), timeout=10)
            if response.status_code == 200:
                return time.monotonic() - started
            last = f"HTTP {response.status_code}: {response.text[:200]}"
            if response.status_code == 503 and _load_failed_answer(response):
                raise SystemExit(f"HTTP 503: {response.json()['error']['message']}")
        except httpx.HTTPError as exc:
            last = repr(exc)
        if log and log.exists() and _load_failed(log, log_start):
            raise SystemExit(f"the model failed to load; see {log}")
        if pid_file and not _alive(pid_file):
            raise SystemExit("torchserve is not running (a port in use?); see logs/torchserve.out")
        time.sleep(0.5)
    raise SystemExit(f"model did not answer within {timeout:.0f} s ({last}); see logs/ts_log.log")


TORCHSERVE_KEY = "$(.venv/bin/python -m scripts.serve.client token)"


def usage_hints(url: str, model: str, task: str, key: str = TORCHSERVE_KEY) -> list[str]:
    """The lines `make serve` prints to show how to call a served model of `handler.task` `task`;
    `key` is the shell expression that gives the bearer key."""
    auth = f'-H "Authorization: Bearer {key}"'
    if task == "embed":
        body = json.dumps({"model": model, "input": ["The weather is lovely today."]})
        target = f"{url}/predictions/{model}/1.0/v1/embeddings"
        return [f"  curl {auth} -H 'Content-Type: application/json' \\", f"       -d '{body}' {target}"]
    body = json.dumps({"prompt": "Today the weather is", "max_new_tokens": 64})
    return [f"  curl -N {auth} -H 'Content-Type: application/json' \\", f"       -d '{body}' {url}/predictions/{model}"]


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().split()[0]), 0)
    except (OSError, ValueError, IndexError):
        return False
    return True


def _load_failed_answer(response: httpx.Response) -> bool:
    """The worker's own answer while it cannot load the model (handler/serving/init_failure.py)."""
    try:
        return response.json()["error"]["type"] == "model_load_failed"
    except (ValueError, KeyError, TypeError):
        return False


def _load_failed(log: Path, offset: int) -> bool:
    with log.open("rb") as f:
        f.seek(offset)
        return b"Load model failed" in f.read()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Client for the Inf2 LLM TorchServe handler")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="llama")
    parser.add_argument("--key-file", type=Path, default=Path("key_file.json"))
    parser.add_argument(
        "--management-url",
        help=f"where an expired inference key is renewed (default: --ts-config's management_address, "
        f"else {DEFAULT_MANAGEMENT_URL})",
    )
    parser.add_argument(
        "--ts-config",
        type=Path,
        default=DEFAULT_TS_CONFIG,
        help="the config.properties `make serve` wrote (its management_address)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="stream a completion and print it as it arrives")
    gen.add_argument("prompt")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-new-tokens tokens")
    wait = sub.add_parser("wait", help="wait until the model answers")
    wait.add_argument("--timeout", type=float, default=300)
    wait.add_argument("--log", type=Path, help="TorchServe log to watch for load failures")
    wait.add_argument("--pid-file", type=Path, help="TorchServe's pid file: stop waiting when it is gone")
    wait.add_argument("--config", type=Path, help="the archive's model-config.yaml: its handler.task picks the probe")
    hints = sub.add_parser("hints", help="print how to call the served models (make serve's closing lines)")
    hints.add_argument("--config", type=Path, help="the --model archive's model-config.yaml")
    hints.add_argument("--also", action="append", default=[], metavar="NAME=CONFIG", help="another served archive")
    hints.add_argument("--key-file-hint", type=Path, help="the ASGI frontend's key file (default: TorchServe's key)")
    probe = sub.add_parser("readiness-body", help="print the JSON body of the readiness request (one token or word)")
    probe.add_argument("--config", type=Path, help="the archive's model-config.yaml: its handler.task picks the body")
    sub.add_parser("token", help="print the inference key (renewed first when it expired or is about to)")
    sub.add_parser("ping", help="GET /ping with the inference key (read now); exit 0 only on 200")
    error = sub.add_parser("worker-error", help="print why the worker failed (the last traceback in the model log)")
    error.add_argument("--model-log", type=Path, default=Path("logs/model_log.log"))
    args = parser.parse_args(argv)
    args.management_url = resolve_management_url(args.management_url, args.ts_config)

    url = f"{args.url}/predictions/{args.model}"
    if args.command == "token":
        print(inference_key(args.key_file, args.management_url) or "")
    elif args.command == "ping":
        try:
            response = httpx.get(
                f"{args.url}/ping", headers=auth_headers(args.key_file, args.management_url), timeout=5
            )
        except httpx.HTTPError as exc:
            raise SystemExit(f"/ping: {exc!r}") from None
        print(response.status_code, response.text.strip())
        sys.exit(0 if response.status_code == 200 else 1)
    elif args.command == "worker-error":
        cause = failure_cause(args.model_log)
        print(f"Cause, from {args.model_log}:\n{cause}" if cause else f"{args.model_log}: no error logged")
    elif args.command == "readiness-body":
        print(json.dumps(readiness_body(task_of(args.config))))
    elif args.command == "hints":
        served = [(args.model, args.config)] + [
            (name, Path(config)) for name, _, config in (a.partition("=") for a in args.also)
        ]
        names = ", ".join(name for name, _ in served)
        asgi = args.key_file_hint is not None
        key = f"$(cat {args.key_file_hint})" if asgi else TORCHSERVE_KEY
        where = f"ASGI frontend; key in {args.key_file_hint}" if asgi else "token auth on; key in key_file.json"
        print(f"Serving {names} on {args.url} ({where}). Try:")
        if task_of(args.config) == "generate" and not asgi:
            print("  make demo")
        for name, config in served:
            print("\n".join(usage_hints(args.url, name, task_of(config), key)))
        print("  make stop")
    elif args.command == "wait":
        waited = wait_ready(
            url, args.key_file, args.timeout, args.log, args.pid_file, args.management_url, task_of(args.config)
        )
        print(f"model {args.model} answered after {waited:.1f} s")
    else:
        body = {"prompt": args.prompt, "max_new_tokens": args.max_new_tokens}
        if args.temperature is not None:
            body["temperature"] = args.temperature
        if args.seed is not None:
            body["seed"] = args.seed
        if args.ignore_eos:
            body["ignore_eos"] = True
        started = time.monotonic()
        first_chunk_at = None
        sys.stdout.write(args.prompt)
        for chunk in stream_generate(url, body, auth_headers(args.key_file, args.management_url)):
            first_chunk_at = first_chunk_at or time.monotonic() - started
            sys.stdout.write(chunk.get("text", ""))
            sys.stdout.flush()
            if "finish_reason" in chunk:
                usage = chunk["usage"]
                print(
                    f"\n[finish_reason={chunk['finish_reason']} prompt_tokens={usage['prompt_tokens']} "
                    f"completion_tokens={usage['completion_tokens']} first chunk after {first_chunk_at:.3f} s, "
                    f"last after {time.monotonic() - started:.3f} s]"
                )
            if "error" in chunk:
                raise SystemExit(f"\nerror: {chunk['error']['message']}")


if __name__ == "__main__":
    main()
