"""`make eval` with no server running says so in one line (not lm-eval's 40-line traceback)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_no_server_at_the_url_is_one_clear_line(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "scripts.eval.evaluate", "--url", url, "--tokenizer", str(tmp_path)]
    done = subprocess.run([*cmd, "--lm-eval", sys.executable], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 1
    assert done.stderr.strip() == f"nothing answers at {url}: start the server first (`make serve`), or pass EVAL_URL"
