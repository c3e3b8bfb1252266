"""`python -m handler.frontend --config model-config.yaml [--model-dir DIR] [--host --port --sagemaker]`:
the ASGI frontend on uvicorn (docs/frontends.md).

Binds 127.0.0.1 (0.0.0.0 with --sagemaker: the container's port 8080 must be reachable). The key:
--key-file (written with a fresh key when absent), else $INF2_API_KEY, else ./frontend-key.txt
(written when absent); --no-auth only behind a proxy that authenticates. SIGTERM: uvicorn stops
SIGTERM: new requests get a 503 (`the server is draining`), the ones in flight (streams included) run on
for up to --drain-s, then uvicorn stops and the model is released (handler/frontend/drain.py).
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import uvicorn
import yaml

from handler.frontend.app import Limits, build_app
from handler.frontend.auth import KEY_ENV, BearerKey
from handler.frontend.drain import Drain, DrainGate, DrainingServer
from handler.frontend.embedding import ServedEmbedder
from handler.frontend.model import ServedModel

DEFAULT_KEY_FILE = Path("frontend-key.txt")
# SageMaker sends SIGTERM and kills the container 30 s later: the streams get most of that.
DRAIN_S = 25.0
GRACE_S = 3  # after the drain: uvicorn's graceful shutdown, then what still runs is cancelled
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m handler.frontend", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="model-config.yaml (the archive's own)")
    parser.add_argument(
        "--model-dir", type=Path, help="the checkpoint (replaces handler.model_checkpoint_dir; `make serve MODEL_DIR=`)"
    )
    parser.add_argument("--model-name", default="model", help="the name in /predictions/<model> and /v1/models")
    parser.add_argument("--host", help="default 127.0.0.1; 0.0.0.0 with --sagemaker")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--sagemaker", action="store_true", help="/ping and /invocations need no key")
    parser.add_argument(
        "--key-file", type=Path, help=f"the bearer key's file (default: ${KEY_ENV}, else ./{DEFAULT_KEY_FILE})"
    )
    parser.add_argument("--no-auth", action="store_true", help="no key at all: only behind an authenticating proxy")
    parser.add_argument("--max-body-bytes", type=int, default=Limits.max_body_bytes)
    parser.add_argument("--body-timeout-s", type=float, default=Limits.body_timeout_s)
    parser.add_argument(
        "--prepare-share",
        type=float,
        default=Limits.prepare_share,
        help="the share of the time that parsing, validating and tokenizing requests may take on average "
        "(0-1; a flood of requests refused at once cannot take more from the step loop)",
    )
    parser.add_argument("--drain-s", type=float, default=DRAIN_S, help="SIGTERM: how long streams in flight may run on")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def key_of(args: argparse.Namespace) -> BearerKey | None:
    if args.no_auth:
        return None
    if args.key_file is None and os.environ.get(KEY_ENV) is not None:
        return BearerKey.from_file_or_env(None)
    return BearerKey.from_file_or_env(args.key_file or DEFAULT_KEY_FILE)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models load from local directories only
    raw = yaml.safe_load(args.config.read_text()) or {}
    if args.model_dir is not None and isinstance(raw.get("handler"), dict):
        raw["handler"] = {**raw["handler"], "model_checkpoint_dir": str(args.model_dir.resolve())}
    # what the config names relatively (a sim profile, a relative checkpoint) lies beside it, as in an archive
    handler_section = raw.get("handler") if isinstance(raw.get("handler"), dict) else {}
    if handler_section.get("task") == "embed":
        model: ServedModel | ServedEmbedder = ServedEmbedder(raw, args.config.resolve().parent, args.model_name)
    else:
        model = ServedModel(raw, args.config.resolve().parent)
    limits = Limits(args.max_body_bytes, args.body_timeout_s, args.prepare_share)
    app = build_app(model, args.model_name, key_of(args), args.sagemaker, limits)
    host = args.host or ("0.0.0.0" if args.sagemaker else "127.0.0.1")
    drain = Drain(args.drain_s)
    config = uvicorn.Config(
        DrainGate(app, drain),
        host=host,
        port=args.port,
        http="h11",
        lifespan="on",
        server_header=False,
        date_header=True,
        timeout_keep_alive=KEEP_ALIVE_S,
        timeout_graceful_shutdown=GRACE_S,
        log_level=args.log_level,
        access_log=False,
    )
    DrainingServer(config, drain).run()


if __name__ == "__main__":
    main()
