"""Structured output on the real model: the grammar makes the JSON valid, the model fills in
the sentence's own values."""

from __future__ import annotations

import json

PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
MESSAGES = [
    {"role": "system", "content": "Extract the person described by the user as JSON with their name, age and city."},
    {"role": "user", "content": "Alice is 30 years old and lives in Paris."},
]


def test_json_schema_extracts_alices_name_age_and_city(real_server, real_client):
    reply = real_client.chat.completions.create(
        model=real_server.model_name,
        messages=MESSAGES,
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}},
        max_tokens=60,
        temperature=0,
    )
    [choice] = reply.choices
    print(f"json_schema: {choice.message.content!r}")
    assert choice.finish_reason == "stop"  # the document was complete, not cut
    person = json.loads(choice.message.content)
    assert person == {"name": "Alice", "age": 30, "city": "Paris"}
    assert list(person) == ["name", "age", "city"]  # the schema's order
    assert type(person["age"]) is int
