"""The pure parts of scripts/bench/hostile.py: the schemas, the requests, the figures and the
table. The servers themselves run only in `make bench-hostile`."""

import json

import pytest

from scripts.bench import hostile


@pytest.mark.parametrize("target", [50_000, 900_000])
def test_wide_schema_is_about_the_size_asked(target):
    schema = hostile.wide_schema("t0", target)
    size = len(json.dumps(schema))
    assert target - 50 <= size <= target
    assert len(schema["properties"]) == 50
    assert all(p["type"] == "string" for p in schema["properties"].values())


def test_wide_schemas_differ_by_tag_in_every_description():
    a, b = hostile.wide_schema("tag-a", 100_000), hostile.wide_schema("tag-b", 100_000)
    assert len(json.dumps(a)) == len(json.dumps(b))
    for name in a["properties"]:
        assert a["properties"][name]["description"] != b["properties"][name]["description"]
        assert "tag-a" in a["properties"][name]["description"]


def test_schema_request_is_a_chat_completion_with_a_json_schema_response_format():
    body = json.loads(hostile.schema_request("abc", 20_000, 8))
    assert body["messages"][0]["role"] == "user" and body["max_tokens"] == 8 and body["stream"] is False
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "record_abc"
    assert fmt["json_schema"]["schema"] == hostile.wide_schema("abc", 20_000)


def test_default_schema_body_fits_torchserve_max_request_size():
    assert len(hostile.schema_request("c3n999x" + "f" * 12, 900_000, 16)) < 1_048_576  # serving/local.properties


def test_routes_per_frontend():
    assert hostile.route("torchserve", "completions") == "/predictions/llama/1.0/v1/completions"
    assert hostile.route("asgi", "chat/completions") == "/v1/chat/completions"


@pytest.mark.parametrize("stream", [True, False])
def test_completion_body_ignores_eos(stream):
    body = hostile.completion_body(200, stream)
    assert body["ignore_eos"] is True and body["max_tokens"] == 200 and body["stream"] is stream
    assert ("stream_options" in body) is stream


def test_raw_request_is_one_whole_http_post():
    body = b'{"a": 1}'
    raw = hostile.raw_request("127.0.0.1", 8080, "/v1/completions", {"Authorization": "Bearer k"}, body)
    head, sent = raw.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    assert lines[0] == "POST /v1/completions HTTP/1.1"
    assert "Content-Length: 8" in lines and "Authorization: Bearer k" in lines and "Host: 127.0.0.1:8080" in lines
    assert sent == body


def test_chunk_content_of_completion_and_chat_streams():
    assert hostile.chunk_content('data: {"choices": [{"text": "hi"}]}') == ("hi", None)
    assert hostile.chunk_content('data: {"choices": [{"delta": {"content": "yo"}}]}') == ("yo", None)
    assert hostile.chunk_content('data: {"choices": [{"delta": {"role": "assistant"}}]}') == ("", None)
    usage = {"completion_tokens": 3}
    assert hostile.chunk_content(json.dumps({"choices": [], "usage": usage}).join(["data: ", ""])) == ("", usage)
    assert hostile.chunk_content("data: [DONE]") == ("", None)
    assert hostile.chunk_content("") == ("", None)


def test_stream_figures():
    s = hostile.Stream(started=10.0, ended=11.0, status=200, chunks=[10.2, 10.3, 10.7, 10.8])
    assert s.ttft_s == pytest.approx(0.2)
    assert s.total_s == pytest.approx(1.0)
    assert s.max_gap_s == pytest.approx(0.4)
    empty = hostile.Stream(started=1.0, ended=2.0, status=503)
    assert empty.ttft_s is None and empty.max_gap_s is None


def test_ratio_and_median():
    assert hostile.ratio(3.0, 1.5) == 2.0
    assert hostile.ratio(None, 1.0) is None and hostile.ratio(1.0, None) is None and hostile.ratio(1.0, 0.0) is None
    assert hostile.median([3.0, None, 1.0, 2.0]) == 2.0
    assert hostile.median([None]) is None


def test_statuses_within_a_window():
    answers = [hostile.Answer(0, t, status) for t, status in [(1, 400), (2, 200), (3, 400), (4, 0), (9, 400)]]
    assert hostile.statuses(answers, 1.5, 5) == {"200": 1, "400": 1, "none": 1}
    assert hostile.statuses(answers) == {"200": 1, "400": 3, "none": 1}
    assert hostile.statuses_text({"200": 1, "400": 3}) == "200x1,400x3"
    assert hostile.statuses_text({}) == "-"


def test_table_has_a_column_per_frontend_and_dashes_for_missing_figures():
    results = {
        "torchserve": {
            "abandoned": {
                "alone": {"ttft_s": 0.05, "total_s": 0.4},
                "after": {"ttft_s": 0.5, "total_s": 1.0, "status": 200},
                "flood": {"sent": 20, "failed": 0},
                "metrics": {
                    "before": {"llm_cancelled_requests": 1.0, "llm_rejected_requests": 0.0},
                    "after_settle": {
                        **{"llm_slots_occupied": 4.0, "llm_requests_waiting": 2.0},
                        **{"llm_cancelled_requests": 19.0, "llm_rejected_requests": 2.0},
                    },
                },
                "ttft_ratio": 10.0,
            }
        },
        "asgi": {},
    }
    table = hostile.format_table(list(results), hostile.rows(results))
    lines = table.splitlines()
    assert lines[0].split() == ["torchserve", "asgi"]
    row = {line[:36].strip(): line[36:].split() for line in lines[1:]}
    assert row["abandoned: sent (failed)"] == ["20", "(0)", "-", "(-)"]
    assert row["TTFT after/alone"] == ["10.00", "-"]
    assert row["slots occupied/waiting, settled"] == ["4/2", "-/-"]
    assert row["cancelled/rejected, settled"] == ["18/2", "-/-"]
    assert not any("schema" in line for line in lines)


def test_command_line():
    args = hostile.parse_args(["--frontend", "asgi", "--only", "schema", "--schema-bytes", "2000000"])
    assert args.frontends == ["asgi"] and args.measurements == ["schema"] and args.schema_bytes == 2_000_000
    both = hostile.parse_args([])
    assert both.frontends == ["torchserve", "asgi"] and both.measurements == ["abandoned", "schema"]
    assert both.abandoned == 200 and both.settle_s == 10.0 and both.model_config.name == "model-config.yaml"
    with pytest.raises(SystemExit):
        hostile.parse_args(["--bystander-tokens", "1"])
