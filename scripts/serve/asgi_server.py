"""`make serve FRONTEND=asgi` and `make stop` for the ASGI frontend: start it in the background, as
`make serve` starts TorchServe, and stop it by its pid file.

    python -m scripts.serve.asgi_server start --pid-file build/asgi.pid --log logs/asgi.log \
        --url http://127.0.0.1:8080 --key-file build/frontend-key.txt -- python -m handler.frontend ...
    python -m scripts.serve.asgi_server stop --pid-file build/asgi.pid --grace 20

`start` runs the command detached (its own session, as nohup: closing the terminal does not stop it;
stdout and stderr to --log), writes its pid to --pid-file, and returns once GET /ping answers 200
(with the bearer key of --key-file once the frontend has written it). If the frontend exits, answers
that the model failed to load, or does not answer within --timeout, it prints the log's last lines,
stops it and exits 1.

`stop` sends SIGTERM to the process of --pid-file (only if it is the ASGI frontend, not some process
that reused the pid): new requests get 503, the streams in flight run on for the frontend's --drain-s;
then it waits, and kills the frontend if it has not exited STOP_MARGIN_S seconds after the drain.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil

FRONTEND_MODULE = "handler.frontend"  # in the frontend's command line: `python -m handler.frontend ...`
DEFAULT_DRAIN_S = 25.0  # handler/frontend/__main__.py's DRAIN_S
STOP_MARGIN_S = 15.0  # after the drain: uvicorn's graceful shutdown (3 s) and the model's release
POLL_S = 0.3
LOG_TAIL_LINES = 40


def running_frontend(pid_file: Path) -> psutil.Process | None:
    """The ASGI frontend named by the pid file, if it still runs."""
    try:
        process = psutil.Process(int(pid_file.read_text().split()[0]))
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process if any(FRONTEND_MODULE in part for part in process.cmdline()) else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def log_tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


def _headers(key_file: Path | None) -> dict[str, str]:
    if key_file is None or not key_file.exists():
        return {}
    key = key_file.read_text().strip()
    return {"Authorization": f"Bearer {key}"} if key else {}


def wait_ping(url: str, key_file: Path | None, process: subprocess.Popen[bytes], timeout: float) -> float:
    """Poll GET /ping until 200; seconds waited. RuntimeError when the process exits or time runs out."""
    started = time.monotonic()
    last = "no answer yet"
    while time.monotonic() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"the ASGI frontend exited with status {process.returncode} ({last})")
        try:
            response = httpx.get(f"{url}/ping", headers=_headers(key_file), timeout=5)
            if response.status_code == 200:
                return time.monotonic() - started
            last = f"HTTP {response.status_code}: {response.text.strip()[:300]}"
            if _load_failed(response):  # it will not load: no point waiting
                raise RuntimeError(f"the model failed to load ({last})")
        except httpx.HTTPError as exc:
            last = repr(exc)
        time.sleep(POLL_S)
    raise RuntimeError(f"the ASGI frontend did not answer /ping within {timeout:.0f} s ({last})")


def _load_failed(response: httpx.Response) -> bool:
    """/ping's answer once the model failed to load (handler/frontend/loading.py: 503 Unhealthy)."""
    try:
        body = response.json()
        return response.status_code == 503 and body["message"].startswith("the model failed to load")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def start(command: list[str], pid_file: Path, log: Path, url: str, key_file: Path | None, timeout: float) -> float:
    """Start `command` detached, record its pid, wait for /ping 200; seconds waited. On failure the
    frontend is stopped, the pid file removed, and RuntimeError names the cause."""
    if (already := running_frontend(pid_file)) is not None:
        raise RuntimeError(f"an ASGI frontend already runs (pid {already.pid}, {pid_file}): `make stop` first")
    pid_file.parent.mkdir(parents=True, exist_ok=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    pid_file.write_text(f"{process.pid}\n")
    try:
        return wait_ping(url, key_file, process, timeout)
    except BaseException:  # a failure, or Ctrl-C while waiting: leave nothing running
        _terminate(process.pid, STOP_MARGIN_S)
        process.wait()  # reap it (this process is its parent)
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        raise


def drain_s_of(cmdline: list[str], default: float) -> float:
    """The frontend's `--drain-s` (the last one given), else `default`."""
    value = default
    for flag, given in itertools.pairwise([*cmdline, ""]):
        if flag == "--drain-s" or flag.startswith("--drain-s="):
            with contextlib.suppress(ValueError):
                value = float(given if flag == "--drain-s" else flag.partition("=")[2])
    return value


def stop(pid_file: Path, grace_s: float = DEFAULT_DRAIN_S) -> float | None:
    """SIGTERM the frontend of `pid_file` and wait for it: its drain (its own `--drain-s`, else
    `grace_s`) plus STOP_MARGIN_S, then kill it; seconds it took, or None when none was running.
    The pid file is removed either way."""
    process = running_frontend(pid_file)
    started = time.monotonic()
    if process is not None:
        with contextlib.suppress(psutil.Error):
            grace_s = drain_s_of(process.cmdline(), grace_s)
        _terminate(process.pid, grace_s + STOP_MARGIN_S)
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    return None if process is None else time.monotonic() - started


def _terminate(pid: int, wait_s: float) -> bool:
    """SIGTERM, wait up to wait_s, then SIGKILL; whether it had to be killed."""
    try:
        process = psutil.Process(pid)
        process.send_signal(signal.SIGTERM)
    except psutil.Error:
        return False
    _, alive = psutil.wait_procs([process], timeout=wait_s)
    for left in alive:
        with contextlib.suppress(psutil.Error):
            left.kill()
    psutil.wait_procs(alive, timeout=5)
    return bool(alive)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Start the ASGI frontend in the background, or stop it")
    sub = parser.add_subparsers(dest="command", required=True)
    begin = sub.add_parser("start", help="start COMMAND detached and wait for /ping 200")
    begin.add_argument("--pid-file", type=Path, required=True)
    begin.add_argument("--log", type=Path, required=True, help="the frontend's stdout and stderr")
    begin.add_argument("--url", default="http://127.0.0.1:8080")
    begin.add_argument("--key-file", type=Path, help="the frontend's bearer key file (/ping needs the key)")
    begin.add_argument("--timeout", type=float, default=600.0)
    begin.add_argument("frontend", nargs=argparse.REMAINDER, help="-- the frontend's command line")
    end = sub.add_parser("stop", help="SIGTERM (a drain), then wait")
    end.add_argument("--pid-file", type=Path, required=True)
    end.add_argument("--grace", type=float, default=DEFAULT_DRAIN_S, help="the drain if its command gives no --drain-s")
    args = parser.parse_args(argv)
    if args.command == "stop":
        took = stop(args.pid_file, args.grace)
        print("the ASGI frontend is not running" if took is None else f"the ASGI frontend stopped in {took:.1f} s")
        return
    command = args.frontend[1:] if args.frontend[:1] == ["--"] else args.frontend
    if not command:
        parser.error("start needs the frontend's command after --")
    try:
        waited = start(command, args.pid_file, args.log, args.url, args.key_file, args.timeout)
    except RuntimeError as exc:
        tail = log_tail(args.log)
        print(f"{tail}\n\n{exc}; the log: {args.log}" if tail else f"{exc}; the log: {args.log}", file=sys.stderr)
        sys.exit(1)
    pid = args.pid_file.read_text().strip()
    print(f"the ASGI frontend (pid {pid}, log {args.log}) answered /ping after {waited:.1f} s")


if __name__ == "__main__":
    main()
