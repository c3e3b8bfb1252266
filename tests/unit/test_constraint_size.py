"""Issue 42 item 3, grammar work within a budget: a constraint's size is checked before anything
compiles it, and a schema's annotations never reach llguidance (they do not shape its grammar)."""

from __future__ import annotations

import json

import pytest

from handler.core.request_checks import check_constraint_size
from handler.errors import InvalidRequest
from handler.grammar import matchers
from handler.grammar.byte_lru import ByteLRU
from handler.grammar.grammars import json_schema_text, llguidance_grammar, without_annotations
from handler.request import Constraint


def test_a_constraint_over_the_limit_is_a_400_naming_its_field():
    constraint = Constraint("json_schema", json_schema_text({"type": "string", "description": "é" * 600}))
    size = len(constraint.value.encode())  # UTF-8 bytes, not characters: "é" is two
    check_constraint_size(constraint, size, "response_format.json_schema.schema")
    with pytest.raises(InvalidRequest) as refused:
        check_constraint_size(constraint, size - 1, "response_format.json_schema.schema")
    assert refused.value.param == "response_format.json_schema.schema"
    assert f"{size:,} bytes" in refused.value.message and f"{size - 1:,}" in refused.value.message


def test_a_lone_surrogate_is_counted_not_raised():
    """A TGI grammar's schema text is JSON inside a string: json.loads lets a lone surrogate through."""
    with pytest.raises(InvalidRequest):
        check_constraint_size(Constraint("regex", "\ud800" * 10), 20, "grammar")


SCHEMA = {
    "title": "Record",
    "description": "what the record holds",
    "$comment": "generated",
    "type": "object",
    "properties": {
        "description": {"type": "string", "description": "a property called description", "examples": ["x"]},
        "title": {"enum": [{"title": "kept: an enum value"}, "b"], "default": "b"},
        "kind": {"const": {"description": "kept: a const value"}},
        "items": {"type": "array", "items": {"anyOf": [{"type": "integer", "title": "n"}, {"$ref": "#/$defs/d"}]}},
    },
    "required": ["description", "title"],
    "$defs": {"d": {"type": "string", "readOnly": True, "writeOnly": False}},
    "x-guidance": {"whitespace_flexible": False},
}


def test_annotations_are_dropped_and_everything_else_kept_in_order():
    stripped = without_annotations(SCHEMA)
    assert stripped == {
        "type": "object",
        "properties": {
            "description": {"type": "string"},
            "title": {"enum": [{"title": "kept: an enum value"}, "b"]},
            "kind": {"const": {"description": "kept: a const value"}},
            "items": {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/d"}]}},
        },
        "required": ["description", "title"],
        "$defs": {"d": {"type": "string"}},
        "x-guidance": {"whitespace_flexible": False},
    }
    assert list(stripped["properties"]) == list(SCHEMA["properties"])  # the output's field order
    assert SCHEMA["properties"]["description"]["description"]  # the client's schema is not changed


def test_a_schema_nested_past_the_recursion_limit_is_walked():
    deep: object = {"type": "string", "description": "leaf"}
    for _ in range(5_000):
        deep = {"type": "array", "items": deep, "title": "level"}
    node = without_annotations(deep)
    for _ in range(5_000):
        assert "title" not in node
        node = node["items"]
    assert node == {"type": "string"}


def test_descriptions_do_not_reach_the_grammar(monkeypatch):
    monkeypatch.setattr(matchers, "cache", ByteLRU(2**20))
    bare = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    described = {**bare, "properties": {"a": {"type": "string", "description": "d" * 100_000}}}
    grammar = llguidance_grammar(Constraint("json_schema", json_schema_text(described)))
    assert grammar == llguidance_grammar(Constraint("json_schema", json_schema_text(bare)))
    assert "d" * 100 not in grammar and len(grammar) < 1_000


@pytest.mark.parametrize(
    ("document", "accepted"),
    [
        ('{"description":"x","title":"b","kind":{"description":"kept: a const value"},"items":[1]}', True),
        ('{"title":"b"}', False),  # the property called "description" is still required, and first
        ('{"description":"x","title":"c"}', False),  # the enum's values still bind
    ],
)
def test_the_stripped_schema_still_binds_the_output(tiny_tokenizer, document, accepted):
    eos = [tiny_tokenizer.eos_token_id]
    view = matchers.tokenizer_view(tiny_tokenizer, None, eos)
    matcher = matchers.compiled(view, llguidance_grammar(Constraint("json_schema", json.dumps(SCHEMA)))).deep_copy()
    tokens = tiny_tokenizer.encode(document, add_special_tokens=False)
    assert (matcher.validate_tokens(tokens) == len(tokens)) is accepted
