"""The serving state directory: how the launcher, the frontend's /ping plugin and the
workers tell each other about draining and failed starts (issue: readiness and drain).

`INF2_STATE_DIR` names it; every launcher the project ships sets it (`make serve`,
scripts/serve/local_torchserve.py, the SageMaker container environment), the frontend passes its
environment to the workers, and the /ping plugin (serving/plugins) reads the same variable.
Unset, draining and the failed-start marker are off and /ping reflects the workers only.

Files in it:
- `drain.json` `{"deadline_unix_s": float}`: present = draining. Written by the stop
  script; the plugin answers 503 "Draining"; workers refuse new requests and end what is
  still in flight at the deadline.
- `drained-<pid>`: written by a draining worker once nothing of it is in flight.
- `failed-<pid>.json` `{"cause": str}`: written by a worker whose initialization failed;
  the plugin answers 503 "Unhealthy" with the cause while it exists.
- `replicas-<pid>.json` `{"status": "Degraded" | "Unhealthy", "cause": str}`: written by a
  worker some of whose model replicas are down, removed once every replica serves again. The
  plugin answers 503 "Unhealthy" (no replica serves) or 200 "Degraded" (some do), with the cause.

`failed-` and `replicas-` markers count only while process `<pid>` is alive: the plugin ignores
those a killed worker left behind.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

ENV_VAR = "INF2_STATE_DIR"
DRAIN_FILE = "drain.json"
REPLICA_STATUSES = ("Degraded", "Unhealthy")


def state_dir() -> Path | None:
    value = os.environ.get(ENV_VAR)
    return Path(value) if value else None


@dataclass(frozen=True)
class Drain:
    deadline_unix_s: float

    def seconds_left(self, now: float | None = None) -> float:
        return self.deadline_unix_s - (time.time() if now is None else now)


def read_drain(directory: Path | None = None) -> Drain | None:
    """The drain order, or None when not draining (or no state dir)."""
    directory = directory or state_dir()
    if directory is None:
        return None
    try:
        data = json.loads((directory / DRAIN_FILE).read_text())
        return Drain(float(data["deadline_unix_s"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return Drain(time.time())  # unreadable order: drain now rather than ignore it


def write_drain(directory: Path, grace_s: float) -> Drain:
    directory.mkdir(parents=True, exist_ok=True)
    drain = Drain(time.time() + grace_s)
    tmp = directory / f".{DRAIN_FILE}.tmp"
    tmp.write_text(json.dumps({"deadline_unix_s": drain.deadline_unix_s}))
    tmp.replace(directory / DRAIN_FILE)  # atomic: readers never see half a file
    return drain


def drained_marker(directory: Path, pid: int | None = None) -> Path:
    return directory / f"drained-{os.getpid() if pid is None else pid}"


def failed_marker(directory: Path, pid: int | None = None) -> Path:
    return directory / f"failed-{os.getpid() if pid is None else pid}.json"


def replicas_marker(directory: Path, pid: int | None = None) -> Path:
    return directory / f"replicas-{os.getpid() if pid is None else pid}.json"


def write_replica_health(directory: Path, status: str, cause: str) -> Path:
    """This process's replicas-<pid>.json {"status", "cause"}, written atomically.

    status: "Degraded" (some replicas serve; /ping stays 200) or "Unhealthy" (none does; 503).
    """
    if status not in REPLICA_STATUSES:
        raise ValueError(f"replica health status must be one of {REPLICA_STATUSES}, not {status!r}")
    directory.mkdir(parents=True, exist_ok=True)
    marker = replicas_marker(directory)
    tmp = marker.with_name(f".{marker.name}.tmp")
    tmp.write_text(json.dumps({"status": status, "cause": cause}))
    tmp.replace(marker)  # atomic: the plugin never reads half a file
    return marker


def clear_replica_health(directory: Path) -> None:
    """Remove this process's replicas-<pid>.json: every replica serves again."""
    replicas_marker(directory).unlink(missing_ok=True)
