"""A small client for the running server: wait until the model answers, or stream a prompt.

TorchServe's token authorization is on by default; the key is read from the
key_file.json TorchServe writes into the directory it was started from.

    python scripts/client.py generate "Today the weather is" --max-new-tokens 64
    python scripts/client.py wait --timeout 120
    python scripts/client.py token          # prints the inference key (for curl)
    python scripts/client.py worker-error   # why the worker failed, from logs/model_log.log
    python scripts/client.py ping           # readiness with the key: exit 0 on 200 (an exec probe)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from scripts.worker_log import failure_cause


def inference_key(key_file: Path) -> str | None:
    """The inference key, or None when TorchServe runs with token auth disabled."""
    if not key_file.exists():
        return None
    return json.loads(key_file.read_text())["inference"]["key"]


def auth_headers(key_file: Path) -> dict[str, str]:
    key = inference_key(key_file)
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


def wait_ready(
    url: str, key_file: Path, timeout: float, log: Path | None = None, pid_file: Path | None = None
) -> float:
    """Poll with a one-token request until the model answers 200; return seconds waited.

    Gives up early when the TorchServe log shows the model failing to load, or when the
    TorchServe process is gone (e.g. a port was already taken).
    """
    started = time.monotonic()
    log_start = log.stat().st_size if log and log.exists() else 0
    body = {"prompt": "ping", "max_new_tokens": 1, "stream": False}
    last = "no answer yet"
    while time.monotonic() - started < timeout:
        try:
            response = httpx.post(url, json=body, headers=auth_headers(key_file), timeout=10)
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


def main() -> None:
    parser = argparse.ArgumentParser(description="Client for the Inf2 LLM TorchServe handler")
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="llama")
    parser.add_argument("--key-file", type=Path, default=Path("key_file.json"))
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
    sub.add_parser("token", help="print the inference key")
    sub.add_parser("ping", help="GET /ping with the inference key (read now); exit 0 only on 200")
    error = sub.add_parser("worker-error", help="print why the worker failed (the last traceback in the model log)")
    error.add_argument("--model-log", type=Path, default=Path("logs/model_log.log"))
    args = parser.parse_args()

    url = f"{args.url}/predictions/{args.model}"
    if args.command == "token":
        print(inference_key(args.key_file) or "")
    elif args.command == "ping":
        try:
            response = httpx.get(f"{args.url}/ping", headers=auth_headers(args.key_file), timeout=5)
        except httpx.HTTPError as exc:
            raise SystemExit(f"/ping: {exc!r}") from None
        print(response.status_code, response.text.strip())
        sys.exit(0 if response.status_code == 200 else 1)
    elif args.command == "worker-error":
        cause = failure_cause(args.model_log)
        print(f"Cause, from {args.model_log}:\n{cause}" if cause else f"{args.model_log}: no error logged")
    elif args.command == "wait":
        waited = wait_ready(url, args.key_file, args.timeout, args.log, args.pid_file)
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
        for chunk in stream_generate(url, body, auth_headers(args.key_file)):
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
