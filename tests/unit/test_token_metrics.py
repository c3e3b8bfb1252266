"""handler/serving/metrics.py: the figures, the X-Request-Start header, and what reaches TorchServe
(the catalogue's metrics through `TorchServeSink`, and `TokenMetrics`' context-taking calls)."""

import logging
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import ts
from ts.metrics.metric_cache_yaml_impl import MetricsCacheYamlImpl
from ts.metrics.metric_type_enum import MetricTypes

import handler.core.metrics
import handler.serving.metrics
from handler.core.metrics import (
    ALL_METRICS,
    CANCELLED,
    DECODE_STEP,
    FILL,
    GENERATED_TOKENS,
    ITL,
    OCCUPIED,
    PREFILL_STEP,
    QUEUE_WAIT,
    ROUND_TRIP,
    SERVING_METRICS,
    STEP_DETOKENIZE,
    STEP_SAMPLING,
    TTFT,
    WAITING,
    MetricKind,
    ServingMetrics,
)
from handler.engine.step_engine import StepRecord
from handler.replicas.replica_set import Health
from handler.serving.metrics import TokenMetrics, TorchServeSink, arrival_time, parse_request_start, request_figures

TS_TYPES = {
    MetricKind.COUNTER: MetricTypes.COUNTER,
    MetricKind.GAUGE: MetricTypes.GAUGE,
    MetricKind.HISTOGRAM: MetricTypes.HISTOGRAM,
}


def sequence(received=10.0, first=10.2, last=11.2, tokens=11, admitted=None):
    return SimpleNamespace(
        received_at=received, first_token_at=first, last_token_at=last, completion_tokens=tokens, admitted_at=admitted
    )


class FrozenClock:
    """Stands in for the `time` module in handler/serving/metrics.py and handler/core/metrics.py: both
    clocks stand still, so a figure computed from them is exact, whatever else the machine is doing."""

    def __init__(self) -> None:
        self.perf = 5_000.0  # time.perf_counter()
        self.wall = 1_800_000_000.0  # time.time()

    def perf_counter(self) -> float:
        return self.perf

    def time(self) -> float:
        return self.wall


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FrozenClock:
    frozen = FrozenClock()
    monkeypatch.setattr(handler.serving.metrics, "time", frozen)
    monkeypatch.setattr(handler.core.metrics, "time", frozen)
    return frozen


class Recorder:
    def __init__(self) -> None:
        self.calls = []
        self.dimensions = []

    def add_metric(self, name, value, unit, idx=None, dimensions=None, metric_type=None):
        self.calls.append((name, value, unit, metric_type))
        self.dimensions.append(dimensions)


def test_figures_follow_the_guidellm_itl_definition():
    f = request_figures(sequence())
    assert f.ttft_s == pytest.approx(0.2)
    assert f.itl_s == pytest.approx(0.1)  # 1.0 s over 10 gaps
    assert f.generated_tokens == 11
    assert request_figures(sequence(last=10.2, tokens=1)).itl_s is None
    assert request_figures(sequence(first=None, tokens=0)) is None


def test_request_start_header_forms():
    now = 1_800_000_000.0
    assert parse_request_start(f"t={now - 2:.3f}", now) == pytest.approx(now - 2)
    assert parse_request_start(f"{(now - 2) * 1000:.0f}", now) == pytest.approx(now - 2)  # milliseconds
    assert parse_request_start(f"t={(now - 2) * 1e6:.0f}", now) == pytest.approx(now - 2)  # microseconds
    assert parse_request_start("t=12", now) is None  # another clock
    assert parse_request_start("soon", now) is None
    assert parse_request_start(None, now) is None


def test_arrival_uses_the_header_else_the_handler_clock(clock):
    stamp = f"t={clock.wall - 1.5:.3f}"  # the proxy saw the request 1.5 s before the handler did
    ctx = SimpleNamespace(get_request_header=lambda i, h: stamp if h == "X-Request-Start" else None)
    assert arrival_time(ctx, 0) == pytest.approx(clock.perf - 1.5)
    ctx = SimpleNamespace(get_request_header=lambda i, h: None)
    assert arrival_time(ctx, 0) == clock.perf


def test_emits_every_metric_with_type_and_unit(clock):
    recorder = Recorder()
    ctx = SimpleNamespace(metrics=recorder)
    metrics = TokenMetrics(compiled_batch_size=8)
    metrics.micro_batch_started(ctx, [clock.perf - 0.5, clock.perf - 0.25])
    metrics.request_finished(ctx, sequence())
    by_name = {}
    for name, value, unit, kind in recorder.calls:
        by_name.setdefault(name, []).append((value, unit, kind))
    assert by_name[FILL.name] == [(0.25, "ratio", MetricTypes.HISTOGRAM)]
    assert sorted(v for v, _, _ in by_name[QUEUE_WAIT.name]) == pytest.approx([0.25, 0.5])
    assert by_name[TTFT.name] == [(pytest.approx(0.2), "s", MetricTypes.HISTOGRAM)]
    assert by_name[ITL.name] == [(pytest.approx(0.1), "s", MetricTypes.HISTOGRAM)]
    assert by_name[GENERATED_TOKENS.name] == [(11, "count", MetricTypes.COUNTER)]


def test_the_calls_are_valid_for_torchserves_metric_cache(caplog):
    """Through TorchServe's own cache (what `context.metrics` is in a worker): no errors."""
    caplog.set_level(logging.INFO)
    cache = MetricsCacheYamlImpl(str(Path(ts.__file__).parent / "configs" / "metrics.yaml"))
    cache.initialize_cache()
    cache.model_name = "m"
    cache.set_request_ids({0: "req-0"})
    ctx = SimpleNamespace(metrics=cache)
    metrics = TokenMetrics(compiled_batch_size=4)
    metrics.micro_batch_started(ctx, [time.perf_counter()])
    metrics.request_finished(ctx, sequence())
    continuous_mode_metrics(metrics, ctx)
    assert not metrics.serving.warned
    assert "Failed" not in caplog.text
    assert {
        r.getMessage().split("[METRICS]")[1].split(".")[0] for r in caplog.records if "[METRICS]llm_" in r.getMessage()
    } == {spec.name for spec in SERVING_METRICS}
    for spec in SERVING_METRICS:
        assert cache.get_metric(spec.name, TS_TYPES[spec.kind]) is not None


def continuous_mode_metrics(metrics: TokenMetrics, ctx) -> None:
    metrics.request_finished(ctx, sequence(admitted=10.05))
    speculated = {
        "decoded_tokens": 5,
        "proposing_rows": 1,
        "proposed_tokens": 3,
        "accepted_tokens": 2,
        "speculating": True,
    }
    steps = [
        StepRecord(0.03, 0.01, 1, 3, 3, 2, 0.004, 0.001, **speculated),
        StepRecord(None, 0.012, 0, 3, 3, 1, 0.002, 0.0005, decoded_tokens=3),
    ]
    metrics.engine_steps(ctx, steps, 3, 1)
    metrics.round_trip(ctx, 0.0015)
    metrics.cancelled(ctx)
    metrics.bind(ctx).rejected("queue_wait")
    metrics.replicas(ctx, Health(3, 2, (4, None, 1), "1 of 3 replicas restarting", None))


def test_replica_gauges_carry_the_replica_index():
    recorder = Recorder()
    TokenMetrics(compiled_batch_size=4).replicas(
        SimpleNamespace(metrics=recorder), Health(3, 2, (4, None, 1), "replica 1 is starting", None)
    )
    assert [(name, value) for name, value, _, _ in recorder.calls] == [
        ("llm_replicas_ready", 2),
        ("llm_replica_slots_occupied", 4),
        ("llm_replica_slots_occupied", 1),
    ]
    assert [[(d.name, d.value) for d in dims] for dims in recorder.dimensions[1:]] == [
        [("Replica", "0")],
        [("Replica", "2")],
    ]


def test_continuous_mode_metrics(clock):
    recorder = Recorder()
    ctx = SimpleNamespace(metrics=recorder)
    continuous_mode_metrics(TokenMetrics(compiled_batch_size=4), ctx)
    by_name = {}
    for name, value, _, _ in recorder.calls:
        by_name.setdefault(name, []).append(value)
    assert by_name[QUEUE_WAIT.name] == [pytest.approx(0.05)]  # arrival to its slot
    assert by_name[PREFILL_STEP.name] == [0.03] and by_name[DECODE_STEP.name] == [0.01, 0.012]
    assert (by_name[OCCUPIED.name], by_name[WAITING.name]) == ([3], [1])
    assert by_name[ROUND_TRIP.name] == [0.0015] and by_name[CANCELLED.name] == [1]
    # the host's share of each step, by stage
    assert by_name[STEP_SAMPLING.name] == [0.004, 0.002] and by_name[STEP_DETOKENIZE.name] == [0.001, 0.0005]


def test_a_broken_metrics_object_never_fails_a_request():
    ctx = SimpleNamespace(metrics=None)
    metrics = TokenMetrics(compiled_batch_size=4)
    metrics.request_finished(ctx, sequence())  # no exception
    assert metrics.serving.warned


def test_every_catalogue_metric_reaches_torchserve_with_its_type_unit_and_dimensions():
    recorder = Recorder()
    sink = TorchServeSink()
    sink.bind(SimpleNamespace(metrics=recorder))
    for spec in ALL_METRICS:
        sink.observe(spec, 1.23456789, {label: f"{label}-value" for label in spec.labels})
    assert [(name, value, unit, kind) for name, value, unit, kind in recorder.calls] == [
        (spec.name, 1.234568, spec.unit, TS_TYPES[spec.kind]) for spec in ALL_METRICS
    ]
    assert [[(d.name, d.value) for d in dims] for dims in recorder.dimensions] == [
        [(label, f"{label}-value") for label in spec.labels] for spec in ALL_METRICS
    ]


def test_token_metrics_emit_every_serving_metric_with_its_torchserve_type(clock):
    """Both modes' calls together reach TorchServe with every metric of the handler's set, each
    with the type and unit of the catalogue."""
    recorder = Recorder()
    ctx = SimpleNamespace(metrics=recorder)
    metrics = TokenMetrics(compiled_batch_size=4)
    metrics.micro_batch_started(ctx, [clock.perf - 0.5])
    metrics.request_finished(ctx, sequence())
    continuous_mode_metrics(metrics, ctx)
    by_spec = {spec.name: spec for spec in SERVING_METRICS}
    assert {name for name, _, _, _ in recorder.calls} == set(by_spec)
    for name, _, unit, kind in recorder.calls:
        assert (unit, kind) == (by_spec[name].unit, TS_TYPES[by_spec[name].kind]), name
    assert not metrics.serving.warned


def test_bind_hands_out_the_context_free_recorder():
    """What the continuous mode can hold instead of passing the context on every call."""
    recorder = Recorder()
    metrics = TokenMetrics(compiled_batch_size=4)
    serving = metrics.bind(SimpleNamespace(metrics=recorder))
    assert serving is metrics.serving and isinstance(serving, ServingMetrics)
    serving.cancelled()
    serving.round_trip(0.25)
    assert [(name, value) for name, value, _, _ in recorder.calls] == [(CANCELLED.name, 1), (ROUND_TRIP.name, 0.25)]


def test_an_unbound_sink_or_a_malformed_sequence_only_warns_once(caplog):
    metrics = ServingMetrics(TorchServeSink(), compiled_batch_size=4)
    metrics.cancelled()  # no context bound yet: no exception
    assert metrics.warned and "could not record metric llm_cancelled_requests" in caplog.text
    bound = TokenMetrics(compiled_batch_size=4)
    bound.request_finished(SimpleNamespace(metrics=Recorder()), sequence(received=None))  # TTFT of None
    assert bound.serving.warned
    caplog.clear()
    metrics.cancelled()
    assert "could not record" not in caplog.text  # once per recorder


def test_ttft_counts_from_receipt_not_from_the_end_of_parsing(tiny_tokenizer):
    """A Sequence's received_at is the request's arrival (X-Request-Start here, 2 s ago), taken
    before the body is parsed and tokenized, in both modes (service.prepare makes every Sequence)."""
    from handler.config import ServingConfig
    from handler.serving.service import GenerationService
    from tests.integration.openai.test_chat_prompt_tokens import PrepareOnlyBackend

    raw = {
        "continuousBatching": True,
        "batchSize": 4,
        "handler": {
            "model_checkpoint_dir": "unused",
            "n_positions": 256,
            "max_new_tokens": 64,
            "default_max_new_tokens": 16,
        },
    }
    service = GenerationService(ServingConfig.from_model_yaml(raw), PrepareOnlyBackend(tiny_tokenizer))
    stamp = f"t={time.time() - 2.0:.6f}"
    context = SimpleNamespace(
        model_name="m",
        get_request_id=lambda i: "req-0",
        get_request_header=lambda i, h: stamp if h == "X-Request-Start" else None,
    )
    before = time.perf_counter()
    work = service.prepare(0, {"body": {"prompt": "Hello there"}}, context)
    assert work.error is None, work.error
    assert work.sequence.received_at == work.arrived_at
    assert before - 2.2 < work.sequence.received_at < before - 1.8
