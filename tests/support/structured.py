"""The JSON Schema the structured-output tests of every route ask for, and its hand-written check.

Bounded on purpose: at most 10 characters of name and 3 digits of age in compact JSON, so a
constrained answer always completes well inside the tests' token budgets."""

from __future__ import annotations

import json

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}


def assert_person(text: str) -> None:
    """`text` is one JSON document valid against PERSON_SCHEMA."""
    person = json.loads(text)
    assert isinstance(person, dict) and set(person) == {"name", "age"}, text
    assert isinstance(person["name"], str) and len(person["name"]) <= 10, text
    assert type(person["age"]) is int and 0 <= person["age"] <= 150, text
