"""What the installed TorchServe can enforce, and what differs between the versions we support.

0.12 (pip, the DLAMI path) has token authorization on by default and the model-registration
API off by default. 0.11.0 (inside every SageMaker Neuron DLC) has neither: no token
authorization without building a plugin, no switch for the model API, no `url_path` header
for the OpenAI routes and no `startupTimeout`. `make serve` refuses to start there (see `main`).

    python -m scripts.serve.torchserve_compat require-secure-defaults   # exit 1 with the reason on 0.11
"""

from __future__ import annotations

import argparse
import re
import sys

SECURE_DEFAULTS_SINCE = (0, 12)


def installed_version() -> tuple[int, ...]:
    from ts.version import __version__

    return tuple(int(part) for part in re.findall(r"\d+", __version__)[:3])


def has_secure_defaults(version: tuple[int, ...] | None = None) -> bool:
    """Token authorization and an off-by-default model API (TorchServe 0.12+)."""
    return (version or installed_version()) >= SECURE_DEFAULTS_SINCE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", choices=["require-secure-defaults"])
    parser.parse_args(argv)
    version = installed_version()
    if has_secure_defaults(version):
        return 0
    print(
        f"TorchServe {'.'.join(map(str, version))} cannot keep this server's security defaults: it has no token "
        "authorization and its model-registration API cannot be switched off. Install TorchServe 0.12 for a local "
        "server (pip install torchserve==0.12.0 torch-model-archiver==0.12.0, as requirements-neuron.txt does); "
        "TorchServe 0.11 is only supported inside the SageMaker Neuron DLC (make sagemaker-local emulates it).",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
