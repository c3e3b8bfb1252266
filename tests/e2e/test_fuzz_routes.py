"""Property-based fuzz of every route (issue 28): arbitrary JSON values and strings in every field,
through a real torchserve (continuous mode, hf backend, the tiny model).

Each example is a small valid body of the route with one to three fields replaced by an arbitrary
JSON value (lone surrogates, huge and non-finite numbers, nested lists and objects, wrong types)
or dropped, plus arbitrary extra keys; or a whole body that is an arbitrary JSON value or bytes.
Whatever it is, the answer must be a 200 (a well-formed body; streamed, well-formed lines ending
with the finish) or a 4xx with the route's JSON error body, and the worker process must stay the
same. After each route's run no slot may be left occupied.

Every request goes to the server on 127.0.0.1 (tests/e2e/isolation.py refuses any other host).
The runs are bounded by `max_examples` (about 60 s in all on 2 cores); shrinking is off, since
each step of it is a request and a crashed worker takes seconds to come back: a failure reports
the example as it was generated. `--hypothesis-seed` replays a run.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.e2e.isolation import (
    BASE_BODIES,
    CHAT,
    COMPLETIONS,
    NATIVE,
    TGI_ROUTES,
    Raw,
    Route,
    contract_problems,
    local_client,
    nested_arrays,
    raw_json,
    send,
    slot_problems,
    wait_until_serving,
    worker_pid,
)
from tests.support.asgi_frontend import AsgiFrontend
from tests.support.torchserve_process import TorchServe, copy_logs_on_failure

MAX_EXAMPLES = 300  # per route: each is one request, 25-40 ms on 2 cores (a 4xx or a 200 of a few tokens)
FUZZ_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,  # nothing written into the checkout
    phases=(Phase.explicit, Phase.generate),
    suppress_health_check=(HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much),
    print_blob=True,
    # CI replays one fixed set of examples (a submission's result must not depend on the draw);
    # anywhere else each run explores new ones.
    derandomize=os.environ.get("CI") == "true",
)


pytestmark = pytest.mark.both_frontends


@pytest.fixture(scope="module")
def server(probed_server: TorchServe | AsgiFrontend) -> TorchServe | AsgiFrontend:
    """The continuous torchserve and the ASGI frontend (there the worker's pid is the frontend's own)."""
    return probed_server


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with local_client() as c:
        yield c


# -- values ------------------------------------------------------------------------------
# Lone surrogates and their neighbours, text around them, control characters, and long text.
hostile_strings = st.sampled_from(
    ["\ud800", "\udfff", "a\ud83d", "\udc00\ud800", "\x00", "\u2028", "\ufeff", "\U0001f600", "", " ", "x" * 5000]
)
strings = st.one_of(
    st.text(alphabet=st.characters(exclude_categories=()), max_size=24),  # surrogates included
    st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010, exclude_categories=()), max_size=6),
    hostile_strings,
)
# JSON text no Python value serializes to, and numbers at the edges.
raw_values = st.sampled_from(
    [
        Raw("1e999999"),
        Raw("-1e999999"),
        Raw("1" + "0" * 5000),  # past Python's 4,300-digit int conversion limit
        Raw("NaN"),
        Raw("Infinity"),
        Raw("-0"),
        Raw("1E-400"),
        Raw("123456789012345678901234567890.5"),
        nested_arrays(70),
        nested_arrays(2000),
    ]
)
edge_numbers = st.sampled_from([-1, 0, 1, 2, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30])
leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    edge_numbers,
    st.floats(allow_nan=True, allow_infinity=True),
    strings,
    raw_values,
)
json_values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(strings, children, max_size=4),
    max_leaves=10,
)


def _not_a_long_run(value: Any) -> bool:
    """Token counts that would make a 200 take long (17 … 600 tokens) are left out."""
    return not (isinstance(value, int) and not isinstance(value, bool) and 16 < value <= 600)


counts = json_values.filter(_not_a_long_run)


# -- fields ------------------------------------------------------------------------------
# Each field of a route, as a function from a fuzzed value to the top-level key and its value:
# nested fields are wrapped in an otherwise valid skeleton, so the value reaches them.
Field = Callable[[Any], tuple[str, Any]]


def top(name: str) -> Field:
    return lambda v: (name, v)


def schema_format(v: Any) -> tuple[str, Any]:
    return "response_format", {"type": "json_schema", "json_schema": {"name": "fuzz", "schema": v}}


def tool(part: str) -> Field:
    def build(v: Any) -> tuple[str, Any]:
        function: dict[str, Any] = {"name": "get_weather", "parameters": {"type": "object"}, part: v}
        return "tools", [{"type": "function", "function": function}]

    return build


def message(part: str) -> Field:
    return lambda v: ("messages", [{"role": "user", "content": "Hello", part: v}])


def grammar(kind: str) -> Field:
    return lambda v: ("grammar", {"type": kind, "value": v})


OPENAI_COMMON: dict[str, Field] = {
    name: top(name)
    for name in (
        "model",
        "temperature",
        "top_p",
        "stop",
        "seed",
        "stream",
        "stream_options",
        "n",
        "ignore_eos",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "response_format",
        "top_k",
        "repetition_penalty",
        "stop_token_ids",
        "user",
        "logprobs",
    )
} | {
    "response_format.json_schema.schema": schema_format,
    "response_format.type": lambda v: ("response_format", {"type": v}),
    "logit_bias key": lambda v: ("logit_bias", {v if isinstance(v, str) else str(v): 1}),
}
LENGTHS = {"max_tokens", "max_new_tokens", "max_completion_tokens", "min_tokens"}
FIELDS: dict[str, dict[str, Field]] = {
    "native": {
        name: top(name)
        for name in (
            "prompt",
            "inputs",
            "parameters",
            "max_new_tokens",
            "do_sample",
            "temperature",
            "top_k",
            "top_p",
            "repetition_penalty",
            "stop",
            "seed",
            "stream",
            "ignore_eos",
            "logprobs",
            "prompt_logprobs",
            "echo",
            "presence_penalty",
            "frequency_penalty",
            "logit_bias",
            "min_tokens",
            "stop_token_ids",
            "grammar",
            "messages",
            "model",
        )
    }
    | {
        "grammar.json": grammar("json"),
        "grammar.regex": grammar("regex"),
        "grammar.type": lambda v: ("grammar", {"type": v}),
    },
    "completions": OPENAI_COMMON
    | {name: top(name) for name in ("prompt", "max_tokens", "min_tokens", "echo", "best_of", "suffix")},
    "chat": OPENAI_COMMON
    | {
        name: top(name)
        for name in (
            "messages",
            "max_tokens",
            "max_completion_tokens",
            "min_tokens",
            "top_logprobs",
            "tools",
            "tool_choice",
            "parallel_tool_calls",
        )
    }
    | {
        "messages.0.content": message("content"),
        "messages.0.role": lambda v: ("messages", [{"role": v, "content": "Hello"}]),
        "messages.0.name": message("name"),
        "messages.0.content.0.text": lambda v: (
            "messages",
            [{"role": "user", "content": [{"type": "text", "text": v}]}],
        ),
        "messages.0.tool_calls": message("tool_calls"),
        "tools.0.function.name": tool("name"),
        "tools.0.function.parameters": tool("parameters"),
        "tools.0.function.description": tool("description"),
        "tool_choice.function.name": lambda v: ("tool_choice", {"type": "function", "function": {"name": v}}),
    },
    "tgi": {name: top(name) for name in ("inputs", "stream", "parameters")},
}
TGI_PARAMETERS = (
    "best_of",
    "decoder_input_details",
    "details",
    "do_sample",
    "frequency_penalty",
    "grammar",
    "adapter_id",
    "max_new_tokens",
    "repetition_penalty",
    "return_full_text",
    "seed",
    "stop",
    "temperature",
    "top_k",
    "top_n_tokens",
    "top_p",
    "truncate",
    "typical_p",
    "watermark",
    "ignore_eos",
)


def _tgi_parameter(name: str) -> Field:
    return lambda v: ("parameters", {"max_new_tokens": 4, name: v})


FIELDS["tgi"] |= {f"parameters.{name}": _tgi_parameter(name) for name in TGI_PARAMETERS}
FIELDS["tgi"] |= {
    "parameters.grammar.value": lambda v: (
        "parameters",
        {"max_new_tokens": 4, "grammar": {"type": "json", "value": v}},
    ),
}

BASES: dict[str, list[dict[str, Any]]] = {
    "native": [BASE_BODIES["native"], {"inputs": "Hello", "parameters": {"max_new_tokens": 4}}],
    "completions": [BASE_BODIES["completions"]],
    "chat": [BASE_BODIES["chat"]],
    "tgi": [BASE_BODIES["generate"]],
}
TARGETS: dict[str, list[Route]] = {
    "native": [NATIVE],
    "completions": [COMPLETIONS],
    "chat": [CHAT],
    "tgi": list(TGI_ROUTES),
}


@dataclass(frozen=True)
class FuzzCase:
    route: Route
    body: bytes

    def __repr__(self) -> str:  # what a failure prints: long bodies cut
        shown = self.body if len(self.body) <= 1500 else self.body[:1500] + b"..."
        return f"POST {self.route.path or '/'} ({len(self.body)} bytes) {shown!r}"


@st.composite
def fuzz_cases(draw: st.DrawFn, target: str) -> FuzzCase:
    """A route of `target` and a body for it, mostly a valid body with a few fields fuzzed."""
    route = draw(st.sampled_from(TARGETS[target]))
    shape = draw(st.sampled_from(["fields"] * 8 + ["value", "bytes"]))
    if shape == "bytes":
        return FuzzCase(route, draw(st.binary(max_size=200)))
    if shape == "value":
        return FuzzCase(route, raw_json(draw(json_values)))
    body = copy.deepcopy(draw(st.sampled_from(BASES[target])))
    fields = FIELDS[target]
    for name in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=3, unique=True)):
        key, value = fields[name](draw(counts if name.split(".")[-1] in LENGTHS else json_values))
        if draw(st.integers(0, 9)) == 0:
            body.pop(key, None)
        elif key == "parameters" and isinstance(body.get(key), dict) and isinstance(value, dict):
            body[key] = {**body[key], **value}  # several TGI parameters fuzzed at once
        else:
            body[key] = value
    body |= draw(st.dictionaries(strings, json_values, max_size=2))
    return FuzzCase(route, raw_json(body))


# -- the property ------------------------------------------------------------------------
@pytest.mark.timeout(150)
@pytest.mark.parametrize(
    "target",
    [
        "native",
        "completions",
        "chat",
        pytest.param(
            "tgi",
            marks=pytest.mark.skipif(
                not TGI_ROUTES, reason="TorchServe 0.11 passes no path: /generate is served as the native route"
            ),
        ),
    ],
)
def test_any_body_gets_a_200_or_a_4xx_and_the_worker_lives(
    server: TorchServe, client: httpx.Client, target: str, request: pytest.FixtureRequest
):
    pid = worker_pid(server)

    @FUZZ_SETTINGS
    @given(case=fuzz_cases(target))
    def fuzz(case: FuzzCase) -> None:
        answer = send(client, server, case.route, case.body)
        problems = contract_problems(case.route, answer)
        pids = server.worker_pids()
        if pids != [pid]:
            wait_until_serving(server)  # the next test starts on a serving worker
            problems.append(f"the worker process changed: {pid} -> {pids}")
        assert not problems, f"{case.route.name}: {'; '.join(problems)}: {answer.short()}"

    try:
        fuzz()
        problems = slot_problems(server)
        assert not problems, problems
    except BaseException:
        copy_logs_on_failure(server, request.config.rootpath / "build" / "test-logs" / "fuzz" / request.node.name)
        raise
