"""handler/core/metrics.py's one catalogue, and the ASGI frontend's Prometheus exposition of it
(handler/frontend/metrics.py, prometheus_client): every metric listed, the values recorded."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from handler.core.metrics import ALL_METRICS, ASGI_METRICS, SERVING_METRICS, MetricKind, ServingMetrics
from handler.engine.step_engine import StepRecord
from handler.frontend.app import build_app
from handler.frontend.metrics import CONTENT_TYPE, FrontendMetrics
from handler.frontend.model import ServedModel
from handler.replicas.replica_set import Health

REPO = Path(__file__).resolve().parents[2]
TORCHSERVE_NAMES = {  # what the handler reported through TorchServe before the catalogue moved to core/
    "llm_time_to_first_token_seconds",
    "llm_inter_token_latency_seconds",
    "llm_generated_tokens",
    "llm_queue_wait_seconds",
    "llm_micro_batch_fill_ratio",
    "llm_slots_occupied",
    "llm_requests_waiting",
    "llm_prefill_step_seconds",
    "llm_decode_step_seconds",
    "llm_step_sampling_seconds",
    "llm_step_detokenize_seconds",
    "llm_decode_tokens_per_row",  # issue 45: speculation's tokens per step, proposals and acceptances
    "llm_spec_proposed_tokens",
    "llm_spec_accepted_tokens",
    "llm_frontend_round_trip_seconds",
    "llm_cancelled_requests",
    "llm_rejected_requests",  # issue 42: the fast 503s with Retry-After
    "llm_replicas_ready",
    "llm_replica_slots_occupied",
}
STEP = StepRecord(
    0.03,
    0.01,
    1,
    3,
    3,
    2,
    0.004,
    0.001,
    decoded_tokens=7,
    proposing_rows=2,
    proposed_tokens=6,
    accepted_tokens=4,
    speculating=True,
)
HEALTH = Health(3, 2, (4, None, 1), "replica 1 is starting", None)


def sequence(received: float = 10.0, first: float = 10.2, last: float = 11.2, tokens: int = 11) -> SimpleNamespace:
    return SimpleNamespace(
        received_at=received, first_token_at=first, last_token_at=last, completion_tokens=tokens, admitted_at=10.05
    )


def families(text: str) -> dict[str, prometheus_client.Metric]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(family: prometheus_client.Metric, sample: str, **labels: str) -> float:
    found = [s.value for s in family.samples if s.name == sample and s.labels == labels]
    assert len(found) == 1, (sample, labels, family.samples)
    return found[0]


# -- the catalogue ----------------------------------------------------------------------
def test_the_catalogue_holds_the_torchserve_metrics_and_the_asgi_frontends_own():
    assert {spec.name for spec in SERVING_METRICS} == TORCHSERVE_NAMES
    assert {spec.name for spec in ASGI_METRICS} == {
        "llm_http_responses",
        "llm_model_ready",
        "llm_requests_in_flight",
        "llm_engine_steps",
    }
    assert len({spec.name for spec in ALL_METRICS}) == len(ALL_METRICS) == 23


def test_names_say_their_kind_and_unit():
    """Counters carry no `_total` (Prometheus exporters add it); histograms are seconds or ratios."""
    for spec in ALL_METRICS:
        assert spec.name.startswith("llm_") and spec.help, spec
        if spec.kind is MetricKind.COUNTER:
            assert not spec.name.endswith("_total") and spec.unit == "count", spec
        if spec.kind is MetricKind.HISTOGRAM:
            assert (spec.name.endswith("_seconds"), spec.unit) in ((True, "s"), (False, "ratio"), (False, "tokens")), (
                spec
            )


def test_the_catalogue_loads_no_transport():
    """core/ ships in the TorchServe archive, which has no prometheus_client, and must not tie the
    ASGI frontend to TorchServe."""
    code = (
        "import sys, handler.core.metrics; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'ts', 'starlette', 'prometheus_client'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


# -- the ASGI frontend's exposition -----------------------------------------------------
def recorded() -> FrontendMetrics:
    metrics = FrontendMetrics()
    metrics.request_finished(sequence())
    metrics.request_finished(sequence(first=10.5, last=10.9, tokens=5))
    metrics.engine_steps([STEP], 3, 1)
    metrics.replicas(HEALTH)
    for _ in range(3):
        metrics.cancelled()
    metrics.response("predictions", 200)
    metrics.response("predictions", 200)
    metrics.response("v1/completions", 503)
    return metrics


def test_every_catalogue_metric_is_exposed():
    exposed = families(recorded().render({"llm_model_ready": 1.0, "llm_engine_steps_total": 7}))
    missing = {spec.name for spec in ALL_METRICS} - set(exposed)
    assert not missing, sorted(missing)
    for spec in ALL_METRICS:
        assert exposed[spec.name].type == spec.kind.value, spec.name


def test_unlabelled_metrics_show_before_any_value():
    exposed = families(FrontendMetrics().render({}))
    for spec in ALL_METRICS:
        if not spec.labels:
            assert exposed[spec.name].samples, spec.name


def test_the_exposition_holds_what_was_recorded():
    exposed = families(recorded().render({"llm_model_ready": 1.0, "llm_requests_in_flight": 2, "llm_engine_steps": 7}))
    ttft = exposed["llm_time_to_first_token_seconds"]
    assert value(ttft, "llm_time_to_first_token_seconds_sum") == pytest.approx(0.2 + 0.5)
    assert value(ttft, "llm_time_to_first_token_seconds_count") == 2
    assert value(ttft, "llm_time_to_first_token_seconds_bucket", le="0.25") == 1
    assert value(ttft, "llm_time_to_first_token_seconds_bucket", le="+Inf") == 2
    assert value(exposed["llm_inter_token_latency_seconds"], "llm_inter_token_latency_seconds_sum") == pytest.approx(
        0.1 + 0.1
    )
    assert value(exposed["llm_queue_wait_seconds"], "llm_queue_wait_seconds_sum") == pytest.approx(0.1)
    assert value(exposed["llm_generated_tokens"], "llm_generated_tokens_total") == 16
    assert value(exposed["llm_cancelled_requests"], "llm_cancelled_requests_total") == 3
    for name, seconds in (
        ("llm_prefill_step_seconds", 0.03),
        ("llm_decode_step_seconds", 0.01),
        ("llm_step_sampling_seconds", 0.004),
        ("llm_step_detokenize_seconds", 0.001),
    ):
        assert value(exposed[name], name + "_sum") == pytest.approx(seconds), name
        assert value(exposed[name], name + "_count") == 1, name
    per_row = exposed["llm_decode_tokens_per_row"]
    assert value(per_row, "llm_decode_tokens_per_row_sum") == pytest.approx(7 / 3)
    assert value(per_row, "llm_decode_tokens_per_row_bucket", le="2.0") == 0
    assert value(per_row, "llm_decode_tokens_per_row_bucket", le="2.5") == 1
    assert value(exposed["llm_spec_proposed_tokens"], "llm_spec_proposed_tokens_total") == 6
    assert value(exposed["llm_spec_accepted_tokens"], "llm_spec_accepted_tokens_total") == 4
    assert value(exposed["llm_slots_occupied"], "llm_slots_occupied") == 3
    assert value(exposed["llm_requests_waiting"], "llm_requests_waiting") == 1
    assert value(exposed["llm_replicas_ready"], "llm_replicas_ready") == 2
    per_replica = exposed["llm_replica_slots_occupied"]
    assert {s.labels["Replica"]: s.value for s in per_replica.samples} == {"0": 4, "2": 1}  # replica 1 is down
    responses = exposed["llm_http_responses"]
    assert value(responses, "llm_http_responses_total", route="predictions", status="200") == 2
    assert value(responses, "llm_http_responses_total", route="v1/completions", status="503") == 1
    assert value(exposed["llm_model_ready"], "llm_model_ready") == 1
    assert value(exposed["llm_requests_in_flight"], "llm_requests_in_flight") == 2
    assert value(exposed["llm_engine_steps"], "llm_engine_steps_total") == 7


def test_a_replica_that_stops_serving_leaves_the_per_replica_gauge():
    metrics = FrontendMetrics()
    metrics.replicas(HEALTH)
    metrics.replicas(Health(3, 1, (None, None, 2), "replicas 0 and 1 are starting", None))
    per_replica = families(metrics.render({}))["llm_replica_slots_occupied"]
    assert {s.labels["Replica"]: s.value for s in per_replica.samples} == {"2": 2}


def test_each_app_has_its_own_registry():
    first, second = FrontendMetrics(), FrontendMetrics()
    first.cancelled()
    assert value(families(second.render({}))["llm_cancelled_requests"], "llm_cancelled_requests_total") == 0
    assert value(families(first.render({}))["llm_cancelled_requests"], "llm_cancelled_requests_total") == 1


def test_a_name_outside_the_catalogue_is_refused_with_one_warning(caplog: pytest.LogCaptureFixture):
    metrics = FrontendMetrics()
    metrics.render({"llm_nonsense": 1.0, "llm_generated_tokens": 5.0})  # a counter is added to, never set
    metrics.render({"llm_nonsense": 1.0})
    assert caplog.text.count("llm_nonsense is neither") == 1 and "llm_generated_tokens is neither" in caplog.text
    assert value(families(metrics.render({}))["llm_generated_tokens"], "llm_generated_tokens_total") == 0


def test_both_frontends_record_through_serving_metrics(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.WARNING)
    metrics = FrontendMetrics()
    assert isinstance(metrics.serving, ServingMetrics) and metrics.serving.sink is metrics
    metrics.request_finished(SimpleNamespace(received_at=None, first_token_at=1.0, completion_tokens=2))  # broken
    assert metrics.serving.warned and "could not record metric request_finished" in caplog.text


# -- the route ----------------------------------------------------------------------------
class Engine:
    occupied, waiting, steps = 2, 1, 40

    def __init__(self) -> None:
        self.records = [STEP, StepRecord(None, 0.012, 0, 2, 2, 1)]

    def take_records(self) -> list[StepRecord]:
        records, self.records = self.records, []
        return records


def test_get_metrics_scrapes_the_model_and_its_replicas():
    config = {
        "batchSize": 24,
        "continuousBatching": True,
        "handler": {"model_checkpoint_dir": "model", "backend": "hf"},
        "scheduler": {"mode": "continuous", "replicas": 3},
    }
    model = ServedModel(config, Path("model"))
    replicas = SimpleNamespace(health=lambda: HEALTH)
    model.engine, model.bridge, model.replicas = Engine(), SimpleNamespace(in_flight=3), replicas  # type: ignore[assignment]
    client = TestClient(build_app(model, "llama", None))  # no lifespan: nothing loads
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"] == CONTENT_TYPE
    assert CONTENT_TYPE == prometheus_client.CONTENT_TYPE_LATEST
    exposed = families(response.text)
    assert value(exposed["llm_model_ready"], "llm_model_ready") == 1
    assert value(exposed["llm_slots_occupied"], "llm_slots_occupied") == 2
    assert value(exposed["llm_requests_waiting"], "llm_requests_waiting") == 1
    assert value(exposed["llm_requests_in_flight"], "llm_requests_in_flight") == 3
    assert value(exposed["llm_engine_steps"], "llm_engine_steps_total") == 40
    assert value(exposed["llm_decode_step_seconds"], "llm_decode_step_seconds_count") == 2
    assert value(exposed["llm_replica_slots_occupied"], "llm_replica_slots_occupied", Replica="2") == 1
    again = families(client.get("/metrics").text)  # the records were taken once
    assert value(again["llm_decode_step_seconds"], "llm_decode_step_seconds_count") == 2


def test_without_speculation_a_step_records_no_tokens_per_row_nor_proposals():
    """Always 1 token a row then: no value per step (TorchServe writes each one as a log line)."""
    metrics = FrontendMetrics()
    metrics.engine_steps([StepRecord(None, 0.01, 0, 3, 3, 0, 0.001, 0.001, decoded_tokens=3)], 3, 0)
    exposed = families(metrics.render({}))
    assert value(exposed["llm_decode_tokens_per_row"], "llm_decode_tokens_per_row_count") == 0
    assert value(exposed["llm_spec_proposed_tokens"], "llm_spec_proposed_tokens_total") == 0
    assert value(exposed["llm_decode_step_seconds"], "llm_decode_step_seconds_count") == 1
