"""A real torchserve in Prometheus mode, and the ASGI frontend: after one request, /metrics shows
the token metrics of the catalogue (handler/core/metrics.py)."""

import shutil
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from handler.core.metrics import (
    ALL_METRICS,
    FILL,
    REJECTED,
    REPLICA_OCCUPIED,
    REPLICAS_READY,
    SERVING_METRICS,
    SPEC_ACCEPTED,
    SPEC_PROPOSED,
    TOKENS_PER_ROW,
    MetricKind,
)

# The bench's server: the properties `make serve` gets too (serving/local.properties: metrics_mode=prometheus,
# model_metrics_auto_detect=true), free ports, and its own temp directory.
from scripts.bench import server as bench_server
from scripts.serve.local_torchserve import local_properties
from tests.support.asgi_frontend import running_asgi_frontend
from tests.support.bench import sim_model_yaml
from tests.support.modes import MODES, with_mode

REPLICA_METRICS = (REPLICAS_READY, REPLICA_OCCUPIED)
LAYOUTS = [(mode, 1) for mode in MODES] + [("continuous", 2)]


def wanted_series(mode: str, replicas: int = 1) -> set[str]:
    """Static mode has the per-request and micro-batch metrics; continuous all but the fill ratio,
    the rejections (none here: reported when a request is turned away) and speculation's counts (no
    speculation here: reported when a row proposes), and the replica gauges only with replicas."""
    unreported = (FILL, REJECTED, SPEC_PROPOSED, SPEC_ACCEPTED, TOKENS_PER_ROW)
    specs = [m for m in SERVING_METRICS if m not in unreported] if mode == "continuous" else SERVING_METRICS[:5]
    specs = [m for m in specs if replicas > 1 or m not in REPLICA_METRICS]
    return {f"{m.name}_count" if m.kind is MetricKind.HISTOGRAM else m.name for m in specs}


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("mode", "replicas"), LAYOUTS, ids=[f"{m}-{r}" for m, r in LAYOUTS])
def test_prometheus_scrape_finds_token_metrics_after_a_request(mode, replicas, tiny_model_dir, tmp_path, request):
    assert local_properties()["metrics_mode"] == "prometheus"
    base = {**sim_model_yaml(tiny_model_dir, time_scale=0.2), "minWorkers": 1, "maxWorkers": 1, "maxBatchDelay": 5}
    config = with_mode(base, mode, n_slots=8)
    if replicas > 1:
        config["scheduler"] = {**config["scheduler"], "replicas": replicas}
        config["batchSize"] = 2 * 8 * replicas
    server = bench_server.start(tmp_path / "ts", tiny_model_dir, config, timeout=90)  # fails with the log tail
    try:
        body = {"prompt": "Today the weather is", "max_new_tokens": 8, "ignore_eos": True}
        headers = {**server.headers, "X-Request-Start": f"t={time.time():.6f}"}
        url = f"{server.url}/predictions/{server.model_name}"
        if mode == "continuous":  # a client that leaves mid-stream, noticed on the next call
            long = {"prompt": "Leave early", "max_new_tokens": 1000, "ignore_eos": True}
            with httpx.stream("POST", url, json=long, headers=server.headers, timeout=60) as response:
                assert response.status_code == 200
                next(response.iter_lines())
        with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as response:
            assert response.status_code == 200
            lines = [line for line in response.iter_lines() if line]
        assert '"completion_tokens": 8' in lines[-1]

        deadline, text, missing = time.monotonic() + 20, "", wanted_series(mode, replicas)
        while missing and time.monotonic() < deadline:
            text = server.scrape_metrics()
            missing = {
                w for w in wanted_series(mode, replicas) if not any(line.startswith(w) for line in text.splitlines())
            }
            time.sleep(0.2 if missing else 0)
        assert not missing, f"not in /metrics: {sorted(missing)}\n{text[:3000]}"
        tokens = [line for line in text.splitlines() if line.startswith("llm_generated_tokens")]
        assert 'ModelName="llama"' in tokens[0]
        assert float(tokens[0].rsplit(" ", 1)[1]) >= 8 + 1  # this request + the readiness probe
        if replicas > 1:
            per_replica = [line for line in text.splitlines() if line.startswith(REPLICA_OCCUPIED.name + "{")]
            assert {'Replica="0"' in line for line in per_replica} == {True, False}, per_replica
    except BaseException:
        shutil.copytree(server.workdir / "logs", request.config.rootpath / "build" / "test-logs" / "metrics-e2e",
                        dirs_exist_ok=True)  # fmt: skip
        raise
    finally:
        server.stop()


@pytest.mark.timeout(180)
def test_the_asgi_frontend_exposes_the_whole_catalogue(tiny_model_dir, tmp_path):
    """prometheus_client's exposition: every metric of the catalogue, the values of this request,
    and the per-replica gauge for each serving replica."""
    config = with_mode(sim_model_yaml(tiny_model_dir, time_scale=0.2), "continuous", n_slots=8)
    config["scheduler"] = {**config["scheduler"], "replicas": 2}
    config["batchSize"] = 2 * 8 * 2
    with running_asgi_frontend(tmp_path / "asgi", tiny_model_dir, config) as server:
        body = {"prompt": "Today the weather is", "max_new_tokens": 8, "ignore_eos": True}
        headers = {**server.headers, "X-Request-Start": f"t={time.time():.6f}"}
        response = httpx.post(server.predictions_url, json=body, headers=headers, timeout=60)
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 10
        while True:  # the response is counted once its last byte is sent: the client may see it first
            text = server.scrape_metrics()
            families = {family.name: family for family in text_string_to_metric_families(text)}
            if "llm_http_responses" in families and families["llm_http_responses"].samples:
                break
            assert time.monotonic() < deadline, text[:3000]
            time.sleep(0.2)
    missing = {m.name for m in ALL_METRICS} - set(families)
    assert not missing, f"not in /metrics: {sorted(missing)}\n{text[:3000]}"

    def total(name: str, sample: str, **labels: str) -> float:
        return sum(s.value for s in families[name].samples if s.name == sample and labels.items() <= s.labels.items())

    assert total("llm_generated_tokens", "llm_generated_tokens_total") >= 8
    assert total("llm_time_to_first_token_seconds", "llm_time_to_first_token_seconds_count") >= 1
    assert total("llm_decode_step_seconds", "llm_decode_step_seconds_count") >= 7
    assert total("llm_http_responses", "llm_http_responses_total", route="predictions", status="200") == 1
    assert total("llm_model_ready", "llm_model_ready") == 1 and total("llm_replicas_ready", "llm_replicas_ready") == 2
    assert {s.labels["Replica"] for s in families[REPLICA_OCCUPIED.name].samples} == {"0", "1"}
