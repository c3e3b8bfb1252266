"""The replica-health marker a worker writes while some of its model replicas are down
(handler/serving/state.py: replicas-<pid>.json, read by the /ping plugin)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from handler.serving.state import clear_replica_health, replicas_marker, write_replica_health


def test_the_marker_is_named_after_the_process(tmp_path: Path):
    assert replicas_marker(tmp_path) == tmp_path / f"replicas-{os.getpid()}.json"
    assert replicas_marker(tmp_path, 1234) == tmp_path / "replicas-1234.json"


def test_write_creates_the_directory_and_writes_status_and_cause(tmp_path: Path):
    directory = tmp_path / "state"  # not there yet
    cause = 'replica 2 of 4 restarting: "NeuronCore" error\nsecond line é'
    marker = write_replica_health(directory, "Degraded", cause)
    assert marker == replicas_marker(directory)
    assert json.loads(marker.read_text()) == {"status": "Degraded", "cause": cause}
    assert [p.name for p in directory.iterdir()] == [marker.name]  # no temp file left behind


def test_write_overwrites_the_previous_marker(tmp_path: Path):
    write_replica_health(tmp_path, "Degraded", "replica 1 restarting")
    marker = write_replica_health(tmp_path, "Unhealthy", "no replica serves")
    assert json.loads(marker.read_text()) == {"status": "Unhealthy", "cause": "no replica serves"}
    assert [p.name for p in tmp_path.iterdir()] == [marker.name]


def test_clear_removes_only_this_process_marker_and_tolerates_none(tmp_path: Path):
    other = replicas_marker(tmp_path, os.getpid() + 1)
    other.write_text(json.dumps({"status": "Degraded", "cause": "another worker"}))
    marker = write_replica_health(tmp_path, "Degraded", "replica 1 restarting")
    clear_replica_health(tmp_path)
    assert not marker.exists() and other.exists()
    clear_replica_health(tmp_path)  # already gone: no error
    clear_replica_health(tmp_path / "missing")  # no state dir at all: no error


@pytest.mark.parametrize("status", ["Healthy", "degraded", "Draining", ""])
def test_only_degraded_or_unhealthy_is_accepted(tmp_path: Path, status: str):
    with pytest.raises(ValueError, match="Degraded"):
        write_replica_health(tmp_path, status, "cause")
    assert not replicas_marker(tmp_path).exists()
