"""handler/api/responses/output.py: output text into Responses items and their events, whatever
the pieces: text, a function call, a custom tool's call written as a function call, a forced custom
tool's input; items close in order, and the non-streamed items are the streamed ones."""

from __future__ import annotations

import json
from typing import Any

from handler.api.responses.output import Events, OutputStream
from handler.api.tool_parsers import parser_for

PARSER = parser_for("llama3_json")


def events_of(text: str) -> list[dict[str, Any]]:
    return [json.loads(block.split("\ndata: ")[1]) for block in text.split("\n\n")[:-1]]


def run(stream: OutputStream, pieces: list[str], status: str = "completed") -> list[dict[str, Any]]:
    return events_of("".join(stream.feed(p) for p in pieces) + stream.end(status))


def test_calls_stream_their_arguments_and_each_closes_before_the_next_opens():
    stream = OutputStream(Events(), PARSER(["get_weather"]))
    call = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    both = call + "; " + call.replace("Paris", "Rome")
    events = run(stream, [both[:20], both[20:70], both[70:]])
    first, second = stream.items
    assert [json.loads(item["arguments"]) for item in stream.items] == [{"city": "Paris"}, {"city": "Rome"}]
    assert first["type"] == second["type"] == "function_call" and first["call_id"] != second["call_id"]
    kinds = [(e["type"], e["output_index"]) for e in events]
    assert kinds.index(("response.output_item.done", 0)) < kinds.index(("response.output_item.added", 1))
    for index, item in enumerate(stream.items):
        deltas = [
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta" and e["output_index"] == index
        ]
        assert "".join(deltas) == item["arguments"]


def test_a_custom_tools_call_written_as_a_function_call_becomes_a_custom_tool_call():
    stream = OutputStream(Events(), PARSER(["apply_patch", "get_weather"]), frozenset({"apply_patch"}))
    events = run(stream, ['{"name": "apply_patch", "parameters": {"input": "BEGIN x END"}}'])
    (item,) = stream.items
    assert item["type"] == "custom_tool_call" and item["input"] == "BEGIN x END" and item["status"] == "completed"
    assert [e["type"] for e in events] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
    ]


def test_a_forced_custom_tools_output_is_its_input_streamed():
    stream = OutputStream(Events(), None, forced_custom="apply_patch")
    events = run(stream, ["BEGIN ", "ab", " END"])
    (item,) = stream.items
    assert item["input"] == "BEGIN ab END" and item["call_id"].startswith("call_")
    assert [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"] == [
        "BEGIN ",
        "ab",
        " END",
    ]
    assert events[-1]["item"]["input"] == "BEGIN ab END"


def test_an_output_cut_short_marks_its_last_item_incomplete_and_numbers_every_event():
    events = Events()
    stream = OutputStream(events, None)
    out = run(stream, ["a", "b"], status="incomplete")
    assert stream.items[0]["status"] == "incomplete" and stream.items[0]["content"][0]["text"] == "ab"
    assert [e["sequence_number"] for e in out] == list(range(len(out))) and events.sequence_number == len(out)
