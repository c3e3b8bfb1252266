"""Tool-call parsers (handler/api/tool_parsers): the Llama 3.1 JSON format whole and streamed,
the registry, and the constraint each parser writes for its own format."""

from __future__ import annotations

import json
import re

import pytest

from handler.api.tool_parsers import (
    DEFAULT_TOOL_PARSER,
    ArgumentsPiece,
    CallStart,
    FunctionSpec,
    TextPiece,
    ToolCall,
    parser_for,
    parser_names,
)
from handler.api.tool_parsers.base import assemble
from handler.api.tool_parsers.json_calls import call_schema, object_end
from handler.grammar.grammars import grammar_problem

TOOLS = ["get_weather", "add"]


def parser(max_calls: int | None = None):
    return parser_for("llama3_json")(TOOLS, max_calls=max_calls)


def calls_of(calls: list[ToolCall]) -> list[tuple[str, dict]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


def test_registry_names_llama3_json_as_the_default():
    assert DEFAULT_TOOL_PARSER == "llama3_json"
    assert "llama3_json" in parser_names()
    assert parser_for(DEFAULT_TOOL_PARSER).name == "llama3_json"
    with pytest.raises(ValueError, match="llama3_json"):
        parser_for("hermes")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', [("get_weather", {"city": "Paris"})]),
        ('<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}', [("add", {"a": 1, "b": 2})]),
        ('  \n{"name": "add", "arguments": {"a": 1}}', [("add", {"a": 1})]),  # "arguments", leading blanks
        ('{"name": "add", "parameters": "{\\"a\\": 1}"}', [("add", {"a": 1})]),  # arguments as JSON text
        (
            '{"name":"get_weather","parameters":{"city":"a;b}"}}; {"name":"add","parameters":{}} ;'
            '{"name":"add","parameters":{"a":[{"x":"}"}]}}',
            [("get_weather", {"city": "a;b}"}), ("add", {}), ("add", {"a": [{"x": "}"}]})],
        ),
        ('{"name": "add", "parameters": {"a": 1}}\n', [("add", {"a": 1})]),  # trailing blanks: no content
    ],
)
def test_whole_output_of_calls_is_calls_without_content(text, expected):
    content, calls = parser().parse(text)
    assert content is None
    assert calls_of(calls) == expected
    assert all(re.fullmatch(r"call_[A-Za-z0-9]{24}", c.id) for c in calls)
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize(
    "text",
    [
        "The weather is fine.",
        '{"name": "get_weather" "parameters": {"city": "Paris"}}',  # invalid JSON
        '{"parameters": {"a": 1}, "name": "add"',  # unfinished, and not yet known to be a call
        '{"name": "send_mail", "parameters": {"to": "x"}}',  # a function the request did not offer
        '{"name": "add"}',  # no arguments
        '{"name": "add", "parameters": [1, 2]}',  # arguments not an object
        '{"answer": 42}',  # JSON, not a call
        'Sure: {"name": "add", "parameters": {}}',  # a call after text is text
        "<|python_tag|>print(1)",
        "",
        "   ",
    ],
)
def test_text_that_is_not_a_call_to_an_offered_function_stays_content(text):
    assert parser().parse(text) == (text, [])


def test_text_after_the_calls_is_content():
    content, calls = parser().parse('{"name": "add", "parameters": {"a": 1}}\nThat adds.')
    assert calls_of(calls) == [("add", {"a": 1})]
    assert content == "\nThat adds."


def test_arguments_are_the_models_own_text_of_the_object():
    _, (call,) = parser().parse('{"name": "get_weather", "parameters": {"city": "Zürich", "days": [1, 2]}}')
    assert call.arguments == '{"city": "Zürich", "days": [1, 2]}'
    assert call.wire() == {
        "id": call.id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich", "days": [1, 2]}'},
    }


def test_a_call_in_another_shape_is_read_when_whole_and_its_arguments_written_compact():
    content, calls = parser().parse('{"parameters": "{\\"a\\": 1}", "name": "add"}')
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("add", '{"a":1}')]


def test_output_cut_short_inside_a_call_keeps_the_call_with_what_its_arguments_have():
    """As OpenAI's: a call committed (name, then its arguments opening) stays a call; the route
    reports finish_reason length."""
    content, calls = parser().parse('{"name": "get_weather", "parameters": {"city": "Par')
    assert content is None
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", '{"city": "Par')]
    _, calls = parser().parse('{"name": "add", "parameters": {"a": 1}')  # the call's own "}" missing
    assert calls_of(calls) == [("add", {"a": 1})]


def test_max_calls_keeps_the_first_and_drops_the_rest():
    text = '{"name": "add", "parameters": {"a": 1}}; {"name": "add", "parameters": {"a": 2}} and text'
    content, calls = parser(max_calls=1).parse(text)
    assert content is None and calls_of(calls) == [("add", {"a": 1})]


def feed_by(text: str, size: int, max_calls: int | None = None) -> list:
    stream = parser(max_calls).stream()
    pieces = []
    for i in range(0, len(text), size):
        pieces += stream.feed(text[i : i + size])
    return pieces + stream.end()


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_streamed_pieces_match_the_whole_parse(size):
    text = (
        ' <|python_tag|>{"name": "get_weather", "parameters": {"city": "a}b"}};'
        '{"parameters": {"a": 1}, "name": "add"}\nok'
    )
    pieces = feed_by(text, size)
    assert "".join(p.raw for p in pieces) == text  # every character accounted for, once, in order
    content, calls = assemble(pieces)
    assert content == "\nok"
    assert calls_of(calls) == [("get_weather", {"city": "a}b"}), ("add", {"a": 1})]
    whole_content, whole_calls = parser().parse(text)
    assert (whole_content, [(c.name, c.arguments) for c in whole_calls]) == (
        content,
        [(c.name, c.arguments) for c in calls],
    )
    starts = [p for p in pieces if isinstance(p, CallStart)]
    assert [p.index for p in starts] == [0, 1] and [p.name for p in starts] == ["get_weather", "add"]


def test_arguments_stream_as_they_are_written_once_the_call_is_known():
    stream = parser().stream()
    assert stream.feed("  ") == []
    assert stream.feed("<|python") == []  # may still be the tag
    assert stream.feed('_tag|>{"name": "add", "param') == []  # not yet known to be a call
    start, first = stream.feed('eters": {"a":')
    assert isinstance(start, CallStart) and (start.index, start.name) == (0, "add")
    assert start.raw == '  <|python_tag|>{"name": "add", "parameters": '
    assert first == ArgumentsPiece(0, '{"a":', '{"a":')
    assert stream.feed(" 1}") == [ArgumentsPiece(0, " 1}", " 1}")]
    assert stream.feed(" }") == [ArgumentsPiece(0, "", " }")]  # the call's own "}": no arguments
    assert stream.feed(" ") == [] and stream.end() == []


def test_text_goes_out_as_soon_as_it_cannot_be_a_call():
    stream = parser().stream()
    assert stream.feed(" ") == []
    assert stream.feed("Hel") == [TextPiece(" Hel")]  # the held blank goes too
    assert stream.feed("lo {") == [TextPiece("lo {")]

    stream = parser().stream()
    assert stream.feed('{"name": "send_mail", "parameters": {') == [
        TextPiece('{"name": "send_mail", "parameters": {')
    ]  # no such tool: text at once


def test_a_first_object_that_is_not_a_call_flushes_everything_as_text():
    stream = parser().stream()
    assert stream.feed('\n{"answer": ') == []
    assert stream.feed("42}") == [TextPiece('\n{"answer": 42}')]
    assert stream.feed(" more") == [TextPiece(" more")]


def test_a_call_not_yet_known_at_the_end_is_content():
    stream = parser().stream()
    first = stream.feed('{"name": "add", "parameters": {}}; {"name": "add", "param')
    assert [type(p) for p in first] == [CallStart, ArgumentsPiece, ArgumentsPiece]
    assert stream.end() == [TextPiece('; {"name": "add", "param')]


def test_object_end_skips_braces_in_strings():
    text = '{"a": "}\\"{", "b": {"c": {}}} tail'
    assert text[: object_end(text, 0)] == '{"a": "}\\"{", "b": {"c": {}}}'
    assert object_end('{"a": {', 0) is None


WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city"],
}


def test_call_schema_names_each_function_as_a_const_with_its_own_arguments():
    one = call_schema([FunctionSpec("get_weather", WEATHER)])
    assert one == {
        "type": "object",
        "properties": {"name": {"const": "get_weather"}, "parameters": WEATHER},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }
    both = call_schema([FunctionSpec("get_weather", WEATHER), FunctionSpec("add", {})])
    assert [o["properties"]["name"] for o in both["anyOf"]] == [{"const": "get_weather"}, {"const": "add"}]
    assert both["anyOf"][1]["properties"]["parameters"] == {"type": "object"}  # open schema: still an object


def test_call_schema_moves_a_functions_definitions_so_its_refs_still_resolve():
    params = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$defs": {"Place": {"type": "object", "properties": {"$ref": {"type": "string"}}}},
        "type": "object",
        "properties": {"to": {"$ref": "#/$defs/Place"}, "via": {"type": "array", "items": {"$ref": "#/$defs/Place"}}},
    }
    schema = call_schema([FunctionSpec("add", {"type": "object"}), FunctionSpec("route", params)])
    assert schema["anyOf"][1]["properties"]["parameters"] == {"$ref": "#/$defs/tool1"}
    moved = schema["$defs"]["tool1"]
    assert "$schema" not in moved
    assert moved["properties"]["to"] == {"$ref": "#/$defs/tool1/$defs/Place"}
    assert moved["properties"]["via"]["items"] == {"$ref": "#/$defs/tool1/$defs/Place"}
    assert moved["$defs"]["Place"]["properties"] == {"$ref": {"type": "string"}}  # a property named "$ref"
    assert schema["anyOf"][0]["properties"]["parameters"] == {"type": "object"}  # no refs: inline


@pytest.mark.parametrize("parallel", [False, True])
def test_the_llama3_constraint_compiles(parallel):
    functions = [FunctionSpec("get_weather", WEATHER), FunctionSpec("add", {"type": "object", "properties": {}})]
    constraint = parser_for("llama3_json").constraint(functions, parallel=parallel)
    assert constraint.kind == ("lark" if parallel else "json_schema")
    assert grammar_problem(constraint) is None


def test_the_config_offers_exactly_the_registered_parsers():
    from typing import get_args

    from handler.config import HandlerConfig

    offered = get_args(HandlerConfig.model_fields["tool_call_parser"].annotation)
    assert sorted(offered) == sorted(parser_names())
