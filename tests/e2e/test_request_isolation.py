"""Request isolation (issue 28): a hostile request can never hurt the other requests of the worker.

Each probe class runs through a real torchserve (continuous mode, hf backend, the tiny model)
while bystander streams (native, 200 tokens, ignore_eos) run one after another beside it. Every
probe must get a 200 or a 4xx with the route's JSON error body (the classes below say which and
what it names), the bystander streams must get all their tokens with no pause over 1.5 s, the
worker process must be the same one afterwards (its pid), and every slot must be free at the end.

The classes: bytes that are not what a route expects (and a prompt of 1 MB); a JSON lone surrogate (`"\\ud800"`) in any
string or key of the body; JSON nested deeper than 64 levels; stop strings past 16 or 4,096
characters in all; a JSON schema too large to compile (12,000 optional properties), compiled off
the step thread so the bystander keeps its pace. Each class also sends a few valid requests near
the limits, which must be served.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.isolation import (
    CHAT,
    COMPLETIONS,
    NATIVE,
    ROUTES,
    TGI_ROUTES,
    Probe,
    Raw,
    Route,
    assert_isolated,
    base_body,
    nested_arrays,
    nested_objects,
    probe,
    raw_json,
)
from tests.support.asgi_frontend import AsgiFrontend
from tests.support.torchserve_process import TorchServe, copy_logs_on_failure

STOP_ANSWER_S = 2.0  # "answered at once": parsing and refusing a 1 MB body takes milliseconds
OPENAI_ROUTES = (COMPLETIONS, CHAT)


pytestmark = pytest.mark.both_frontends


@pytest.fixture(scope="module")
def server(probed_server: TorchServe | AsgiFrontend) -> TorchServe | AsgiFrontend:
    """The continuous torchserve and the ASGI frontend (there the worker's pid is the frontend's own)."""
    return probed_server


def check(server: TorchServe, request: pytest.FixtureRequest, probes: list[Probe]) -> None:
    """The probes beside the bystander (tests/e2e/isolation.py); the server's logs go to
    build/test-logs/isolation/<test> when something went wrong."""
    try:
        assert_isolated(server, probes)
    except BaseException:
        dest = request.config.rootpath / "build" / "test-logs" / "isolation" / request.node.name
        copy_logs_on_failure(server, dest)
        raise


# -- 1. whatever bytes arrive ------------------------------------------------------------
def garbage_bodies(route: Route) -> dict[str, bytes]:
    """Bodies no client should send: each must get a 200 or a 4xx with a JSON error body."""
    valid = raw_json(base_body(route))
    return {
        "an empty body": b"",
        "bytes that are not UTF-8": b"\xff\xfe\x00\x80garbage",
        "an overlong UTF-8 encoding": b'{"prompt": "\xc0\xaf", "inputs": "\xc0\xaf"}',
        "a surrogate encoded in UTF-8": b'{"prompt": "\xed\xa0\x80", "inputs": "\xed\xa0\x80"}',
        "cut JSON": valid[: len(valid) // 2],
        "a JSON array": b"[1, 2, 3]",
        "JSON null": b"null",
        "a JSON number": b"42",
        "a JSON string": b'"just a string"',
        "NUL bytes": b"\x00" * 64,
        "a raw control character in a string": valid.replace(b"Hello", b"He\x01llo"),
        "duplicate keys": valid[:-1] + b', "stream": false, "stream": 7}',
        "a UTF-8 byte order mark": b"\xef\xbb\xbf" + valid,
        "a seed of 5,000 digits": raw_json(base_body(route, seed=Raw("1" + "0" * 5000))),
        "a temperature of 1e999999": raw_json(base_body(route, temperature=Raw("1e999999"))),
        "a temperature of NaN": raw_json(base_body(route, temperature=Raw("NaN"))),
        "a top_p of -Infinity": raw_json(base_body(route, top_p=Raw("-Infinity"))),
        "a max token count of 2**64": raw_json(base_body(route, **{_max_tokens(route): 2**64})),
        "100 KB of whitespace": valid[:-1] + b" " * 100_000 + b"}",
        "an unclosed array 100,000 deep": b"[" * 100_000,
        "a key of 100,000 characters": raw_json({**base_body(route), "k" * 100_000: 1}),
        "a prompt of 1,000,000 characters": raw_json(_with_prompt(route, "word " * 200_000)),
    }


def _with_prompt(route: Route, text: str) -> dict[str, Any]:
    if route is CHAT:
        return base_body(route, messages=[{"role": "user", "content": text}])
    return base_body(route, **{"inputs" if route.api == "tgi" else "prompt": text})


def _max_tokens(route: Route) -> str:
    return {"native": "max_new_tokens", "openai": "max_tokens", "tgi": "max_new_tokens"}[route.api]


@pytest.mark.timeout(180)
def test_no_bytes_end_the_worker(server: TorchServe, request: pytest.FixtureRequest):
    probes = [
        probe(name, route, body, outcome="any") for route in ROUTES for name, body in garbage_bodies(route).items()
    ]
    check(server, request, probes)


# -- 2. lone surrogates ------------------------------------------------------------------
HIGH, LOW = "\ud800", "\udfff"
# A lone surrogate at the start, at the end, and a pair in the wrong order.
LONE = (HIGH, f"text{LOW}", f"text{HIGH}", f"{LOW}{HIGH}")
VALID_PAIR = "emoji \U0001f600"  # written as the escaped pair "\ud83d\ude00": valid


def _schema_format(schema: Any, name: str = "probe") -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


def _tool(name: str = "get_weather", parameters: Any = None, description: str = "weather") -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters or {"type": "object"}},
    }


def surrogate_probes() -> list[Probe]:
    """A lone surrogate in every kind of string the routes read, each naming its field."""
    s = iter(LONE * 20)
    found: list[Probe] = []
    for route in OPENAI_ROUTES:
        cases: dict[str, tuple[dict[str, Any], str]] = {
            "model": (base_body(route, model=next(s)), "model"),
            "user": (base_body(route, user=next(s)), "user"),
            "a stop string": (base_body(route, stop=["ok", next(s)]), "stop"),
            "a logit_bias key": (base_body(route, logit_bias={next(s): 1}), "logit_bias"),
            "an object key": ({**base_body(route), HIGH: 1}, "\\ud800"),
            "a key of the response_format schema": (
                base_body(route, response_format=_schema_format({"type": "object", "properties": {next(s): {}}})),
                "response_format",
            ),
        }
        if route is COMPLETIONS:
            cases["the prompt"] = (base_body(route, prompt=next(s)), "prompt")
            cases["a prompt in a list"] = (base_body(route, prompt=[next(s)]), "prompt")
        else:
            cases |= {
                "a message's content": (base_body(route, messages=[{"role": "user", "content": next(s)}]), "messages"),
                "a content part's text": (
                    base_body(route, messages=[{"role": "user", "content": [{"type": "text", "text": next(s)}]}]),
                    "messages",
                ),
                "a message's role": (base_body(route, messages=[{"role": next(s), "content": "hi"}]), "messages"),
                "a message's name": (
                    base_body(route, messages=[{"role": "user", "content": "hi", "name": next(s)}]),
                    "messages",
                ),
                "a tool name": (base_body(route, tools=[_tool(next(s))]), "tools"),
                "a tool description": (base_body(route, tools=[_tool(description=next(s))]), "tools"),
                "the named tool_choice": (
                    base_body(route, tools=[_tool()], tool_choice={"type": "function", "function": {"name": next(s)}}),
                    "tool_choice",
                ),
            }
        found += [probe(name, route, body, field=f) for name, (body, f) in cases.items()]
    native: dict[str, tuple[dict[str, Any], str]] = {
        "the prompt": (base_body(NATIVE, prompt=next(s)), "prompt"),
        "a stop string": (base_body(NATIVE, stop=[next(s)]), "stop"),
        "a logit_bias key": (base_body(NATIVE, logit_bias={next(s): 1}), "logit_bias"),
        "a grammar's regex": (base_body(NATIVE, grammar={"type": "regex", "value": next(s)}), "grammar"),
        "an object key": ({**base_body(NATIVE), HIGH: 1}, "\\ud800"),
        "the inputs of a Hugging Face body": ({"inputs": next(s), "parameters": {"max_new_tokens": 4}}, "inputs"),
        "a stop string of a Hugging Face body": (
            {"inputs": "hi", "parameters": {"max_new_tokens": 4, "stop": [next(s)]}},
            "parameters",
        ),
        "the model of an OpenAI-shaped body": ({"model": next(s), "prompt": "hi", "max_tokens": 4}, "model"),
    }
    found += [probe(name, NATIVE, body, field=f) for name, (body, f) in native.items()]
    for route in TGI_ROUTES:
        tgi: dict[str, tuple[dict[str, Any], str]] = {
            "the inputs": (base_body(route, inputs=next(s)), "inputs"),
            "a stop sequence": (base_body(route, stop=[next(s)]), "parameters.stop"),
            "the adapter_id": (base_body(route, adapter_id=next(s)), "parameters.adapter_id"),
            "a grammar's regex": (base_body(route, grammar={"type": "regex", "value": next(s)}), "parameters.grammar"),
            "a key of the parameters": (base_body(route, **{HIGH: 1}), "parameters"),
            "an object key": ({**base_body(route), HIGH: 1}, "\\ud800"),
        }
        found += [probe(name, route, body, field=f) for name, (body, f) in tgi.items()]
    return found


def test_a_lone_surrogate_anywhere_is_a_400_naming_the_field(server: TorchServe, request: pytest.FixtureRequest):
    probes = surrogate_probes()
    for route in ROUTES:  # a valid surrogate pair is text like any other
        probes.append(probe("a valid surrogate pair", route, _with_prompt(route, VALID_PAIR), outcome="served"))
    check(server, request, probes)


# -- 3. deep nesting ---------------------------------------------------------------------
DEEP = nested_arrays(2000)  # deeper than Python's json and pydantic recursion allow


def deep_probes() -> list[Probe]:
    """JSON nested past 64 levels in the fields that are recursed into, on every route."""
    found: list[Probe] = []
    for route in ROUTES:
        found += [
            probe("the whole body 2,000 arrays deep", route, raw_json(DEEP)),
            probe("an unknown field 100,000 arrays deep", route, {**base_body(route), "x": nested_arrays(100_000)}),
            probe("an unknown field 2,000 objects deep", route, {**base_body(route), "x": nested_objects(2000)}),
            probe("an unknown field 65 levels deep", route, {**base_body(route), "x": nested_arrays(64)}),
            probe("an unknown field 64 levels deep", route, {**base_body(route), "x": nested_arrays(63)}, "served"),
        ]
    for route in OPENAI_ROUTES:
        found.append(probe("response_format's schema", route, base_body(route, response_format=_schema_format(DEEP))))
    found += [
        probe("the prompt", COMPLETIONS, base_body(COMPLETIONS, prompt=DEEP)),
        probe("a message's content", CHAT, base_body(CHAT, messages=[{"role": "user", "content": DEEP}])),
        probe("a tool's parameters", CHAT, base_body(CHAT, tools=[_tool(parameters=DEEP)], tool_choice="required")),
        probe("the prompt", NATIVE, base_body(NATIVE, prompt=DEEP)),
        probe("the grammar", NATIVE, base_body(NATIVE, grammar={"type": "json", "value": DEEP})),
    ]
    for route in TGI_ROUTES:
        found += [
            probe("the inputs", route, base_body(route, inputs=DEEP)),
            probe("the grammar", route, base_body(route, grammar={"type": "json", "value": DEEP})),
            probe("a parameter 65 levels deep", route, base_body(route, x=nested_arrays(63))),
        ]
    return found


def test_json_nested_deeper_than_64_levels_is_a_400_on_every_route(server: TorchServe, request: pytest.FixtureRequest):
    check(server, request, deep_probes())


# -- 4. stop strings ---------------------------------------------------------------------
def stop_probes() -> list[Probe]:
    """More than 16 stop strings or 4,096 characters in all: refused at once, naming `stop`."""
    found: list[Probe] = []
    for route in (NATIVE, COMPLETIONS, CHAT, *TGI_ROUTES[:1]):
        found += [
            probe("17 stop strings", route, base_body(route, stop=[f"s{i}" for i in range(17)]), field="stop"),
            probe(
                "one stop string of 1,000,000 characters",
                route,
                base_body(route, stop="x" * 1_000_000),
                field="stop",
                within_s=STOP_ANSWER_S,
            ),
            probe(
                "16 stop strings of 60,000 characters",
                route,
                base_body(route, stop=[chr(ord("a") + i) * 60_000 for i in range(16)]),
                field="stop",
                within_s=STOP_ANSWER_S,
            ),
            probe("4,098 characters in two", route, base_body(route, stop=["y" * 2049, "z" * 2049]), field="stop"),
            probe(
                "16 stop strings of 4,096 characters in all",
                route,
                base_body(route, stop=[chr(ord("a") + i) * 256 for i in range(16)]),
                outcome="served",
            ),
        ]
    return found


def test_stop_strings_past_16_or_4096_characters_are_refused_at_once(
    server: TorchServe, request: pytest.FixtureRequest
):
    check(server, request, stop_probes())


# -- 5. a schema too large to compile ----------------------------------------------------
HOSTILE_SCHEMA = {"type": "object", "properties": {f"field_{i}": {"type": "string"} for i in range(12_000)}}
SMALL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}


@pytest.mark.timeout(180)
def test_a_hostile_schema_is_a_400_and_its_compile_leaves_the_bystander_its_pace(
    server: TorchServe, request: pytest.FixtureRequest
):
    # One route per way a schema arrives (OpenAI's response_format, the native/TGI grammar): the compile
    # behind them is one (handler/grammar/compiler.py); each hostile compile costs seconds on 2 cores.
    hostile = _schema_format(HOSTILE_SCHEMA)
    probes = [
        probe("12,000 optional properties", CHAT, base_body(CHAT, response_format=hostile), field="response_format"),
        probe(
            "12,000 optional properties",
            NATIVE,
            base_body(NATIVE, grammar={"type": "json", "value": HOSTILE_SCHEMA}),
            field="grammar",
        ),
        probe("a small schema", CHAT, base_body(CHAT, response_format=_schema_format(SMALL_SCHEMA)), "served"),
    ]
    check(server, request, probes)


# -- 6. a schema with no finite document (issue 29) ----------------------------------------
RECURSIVE_SCHEMAS = {
    "$ref to the root": {"$ref": "#"},
    "anyOf of the root": {"anyOf": [{"$ref": "#"}]},
    "a $defs cycle": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    "a required property that is the root": {
        "type": "object",
        "properties": {"child": {"$ref": "#"}},
        "required": ["child"],
    },
}


def test_a_schema_with_no_finite_document_is_a_400_not_an_empty_200(server: TorchServe, request: pytest.FixtureRequest):
    """These compile, then the grammar engine gives up at the first tokens of any output: before,
    a 200 with `finish_reason: stop` and text that does not validate ("" or "{")."""
    probes = [
        probe(name, CHAT, base_body(CHAT, response_format=_schema_format(schema)), field="response_format")
        for name, schema in RECURSIVE_SCHEMAS.items()
    ]
    check(server, request, probes)
