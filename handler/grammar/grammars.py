"""A `Constraint` as an llguidance grammar, and why one cannot be compiled.

JSON is generated compact (no whitespace between tokens, `,` and `:` as separators): with
flexible whitespace a weak or random model can spend its whole budget on blanks inside a
valid document. A schema's own `x-guidance` options still override this.
"""

from __future__ import annotations

import json

import llguidance

from handler.grammar import matchers
from handler.request import Constraint

COMPACT_JSON: llguidance.JsonCompileOptions = {"whitespace_flexible": False}
ANY_JSON_OBJECT = {"type": "object"}


def llguidance_grammar(constraint: Constraint) -> str:
    """The grammar text llguidance's matcher takes (cached within the process's byte budget: the
    receipt check and the slot's matcher both need it). Raises ValueError for a schema that is not
    a JSON object."""
    key = ("grammar", constraint)
    grammar = matchers.cache.get(key)
    if grammar is None:
        grammar = _grammar_text(constraint)
        matchers.cache.put(key, grammar, len(constraint.value) + len(grammar))
    return grammar


def _grammar_text(constraint: Constraint) -> str:
    matcher = llguidance.LLMatcher
    if constraint.kind == "json_object":
        return matcher.grammar_from_json_schema(ANY_JSON_OBJECT, defaults=COMPACT_JSON)
    if constraint.kind == "json_schema":
        return matcher.grammar_from_json_schema(constraint.value, defaults=COMPACT_JSON)
    if constraint.kind == "regex":
        return matcher.grammar_from_regex(constraint.value)
    if constraint.kind == "lark":
        return matcher.grammar_from_lark(constraint.value)
    raise ValueError(f"unknown constraint kind {constraint.kind!r}")


def grammar_problem(constraint: Constraint) -> str | None:
    """Why the constraint's grammar cannot be compiled (llguidance's own words, one line), or None
    when it can; without a tokenizer (the receipt check builds the whole matcher:
    handler/grammar/compiler.py)."""
    try:
        grammar = llguidance_grammar(constraint)
    except ValueError as exc:
        return matchers.error_gist(str(exc))
    return matchers.validate(grammar)


def json_schema_text(schema: object) -> str:
    """A schema as the constraint's value: compact JSON text in the client's key order (the order
    of `properties` is the order the output's fields must come in, as OpenAI's strict mode does)."""
    return json.dumps(schema, ensure_ascii=False, separators=(",", ":"))
