"""The ASGI frontend's generation model (handler/frontend/model.py, loading.py, threads.py): /ping's
answers (the bodies TorchServe's readiness plugin gives, replica health included), a replica that
gives up failing the model, and the core left to the event loop."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from handler.errors import ServingError
from handler.frontend.model import ServedModel
from handler.replicas.replica_set import Health

CONFIG = {
    "batchSize": 24,
    "continuousBatching": True,
    "handler": {"model_checkpoint_dir": "model", "backend": "hf"},
    "scheduler": {"mode": "continuous", "replicas": 3},
}


class Replicas:
    """A ReplicaSet as /ping sees it: its health, and the requests it was told to fail."""

    def __init__(self, health: Health) -> None:
        self.current = health
        self.failed_with: list[ServingError] = []

    def health(self) -> Health:
        return self.current

    def fail_all(self, error: ServingError) -> None:
        self.failed_with.append(error)


def serving(health: Health) -> tuple[ServedModel, Replicas]:
    model = ServedModel(CONFIG, Path("model"))
    replicas = Replicas(health)
    model.bridge, model.replicas = object(), replicas  # type: ignore[assignment]
    return model, replicas


def test_loading_then_healthy():
    model = ServedModel(CONFIG, Path("model"))
    assert model.readiness()[0] == 503 and model.readiness()[1]["status"] == "Loading"
    model.bridge = object()  # type: ignore[assignment]
    assert model.readiness() == (200, {"status": "Healthy"})


def test_a_failed_load_is_unhealthy_with_its_cause():
    model = ServedModel(CONFIG, Path("model"))
    model.failure = "OSError: no checkpoint"
    status, body = model.readiness()
    assert status == 503 and body["status"] == "Unhealthy" and "OSError: no checkpoint" in body["message"]


def test_replicas_down_are_degraded_while_one_serves_and_unhealthy_when_none_does():
    model, replicas = serving(Health(3, 2, (1, None, 0), "2 of 3 replicas serving (replica 1 is starting)", None))
    assert model.readiness() == (
        200,
        {"status": "Degraded", "message": "2 of 3 replicas serving (replica 1 is starting)"},
    )
    replicas.current = Health(3, 0, (None, None, None), "0 of 3 replicas serving (...)", None)
    assert model.readiness() == (503, {"status": "Unhealthy", "message": "0 of 3 replicas serving (...)"})
    replicas.current = Health(3, 3, (0, 0, 0), None, None)
    assert model.readiness() == (200, {"status": "Healthy"})


def test_a_replica_that_gives_up_makes_the_model_unhealthy():
    model, _ = serving(Health(3, 2, (0, None, 0), "2 of 3 replicas serving (...)", "replica 1 failed 3 starts"))
    model.client = SimpleNamespace(failure="the model's replicas failed: replica 1 failed 3 starts")  # type: ignore[assignment]
    model._replica_health(model.replicas.health())  # type: ignore[union-attr]
    assert not model.ready
    status, body = model.readiness()
    assert status == 503 and body["status"] == "Unhealthy" and "replica 1 failed 3 starts" in body["message"]


def test_a_core_is_left_to_the_loop_unless_the_environment_or_the_config_says_otherwise():
    from handler.frontend.threads import intra_op_threads

    assert intra_op_threads(None, {}, 2) == 1
    assert intra_op_threads(None, {}, 192) == 191
    assert intra_op_threads(None, {}, 1) == 1
    assert intra_op_threads(None, {"OMP_NUM_THREADS": "4"}, 8) is None
    assert intra_op_threads(3, {}, 8) is None
