"""A `Constraint` as an llguidance grammar, and why one cannot be compiled.

JSON is generated compact (no whitespace between tokens, `,` and `:` as separators): with
flexible whitespace a weak or random model can spend its whole budget on blanks inside a
valid document. A schema's own `x-guidance` options still override this.

A schema's annotations (`description`, `title`, `examples`, ...) are dropped before llguidance
sees it: they do not shape the grammar (llguidance skips them), yet they can be most of a schema's
bytes, which llguidance would parse and the grammar text (so the cache) would keep: a 0.9 MB schema
of 50 described properties compiles in 5 ms instead of 9, to a grammar of 3 KB instead of 0.9 MB.
"""

from __future__ import annotations

import json
from typing import Any

import llguidance

from handler.grammar import matchers
from handler.request import Constraint

COMPACT_JSON: llguidance.JsonCompileOptions = {"whitespace_flexible": False}
ANY_JSON_OBJECT = {"type": "object"}
# Keywords llguidance ignores as annotations (its json/schema.rs META_AND_ANNOTATIONS).
ANNOTATIONS = frozenset({"$comment", "title", "description", "default", "examples", "readOnly", "writeOnly"})
# Keywords whose value maps names to subschemas: a name is kept, whatever it is (a property may be
# called "description").
NAME_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
VALUES = frozenset({"const", "enum"})  # instances, not schemas: kept as they are


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
        schema = without_annotations(json.loads(constraint.value))
        return matcher.grammar_from_json_schema(schema, defaults=COMPACT_JSON)
    if constraint.kind == "regex":
        return matcher.grammar_from_regex(constraint.value)
    if constraint.kind == "lark":
        return matcher.grammar_from_lark(constraint.value)
    raise ValueError(f"unknown constraint kind {constraint.kind!r}")


def without_annotations(schema: Any) -> Any:
    """A copy of a JSON Schema without its annotation keywords, in the same key order; property
    names and `const` / `enum` values are kept whatever they hold. Walked with a stack, not
    recursion (a TGI grammar's schema text may nest as deep as json.loads allows)."""
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(schema, root, 0)]  # (node, its copy's container, its key there)
    while stack:
        node, parent, key = stack.pop()
        if isinstance(node, dict):
            copy: dict[str, Any] = {}
            for name, value in node.items():
                if name in ANNOTATIONS:
                    continue
                copy[name] = value  # its place; a subschema's copy replaces it
                if name in NAME_MAPS and isinstance(value, dict):
                    copy[name] = names = dict(value)
                    stack.extend((sub, names, sub_name) for sub_name, sub in value.items())
                elif name not in VALUES:
                    stack.append((value, copy, name))
            parent[key] = copy
        elif isinstance(node, list):
            parent[key] = items = list(node)
            stack.extend((sub, items, i) for i, sub in enumerate(node))
        else:
            parent[key] = node
    return root[0]


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
