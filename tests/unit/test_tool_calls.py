"""Tool calling on the chat route (handler/api/openai.py ChatCompletionsApi with
handler/api/tool_schemas.py): the request's 400s, the prompt through the chat template, the
constraint for "required" / a named function (driven by the grammar masks over random logits:
every output is a valid call), and the response, whole and streamed, read back by the official
`openai` client's own types and stream accumulator."""

from __future__ import annotations

import copy
import json
from typing import Any, Literal

import pytest
import torch
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from pydantic import BaseModel, ConfigDict, Field

from handler.api.openai import ChatCompletionsApi
from handler.engine.sequence import FinishReason, Sequence
from handler.errors import InvalidRequest
from handler.grammar.grammars import grammar_problem
from handler.grammar.masks import GrammarMasks
from handler.request import GenerationRequest, Limits, TokenChoice

LIMITS = Limits(default_max_new_tokens=16, max_new_tokens=256)
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]


class Weather(BaseModel):
    model_config = ConfigDict(extra="forbid")
    city: str = Field(max_length=10)
    unit: Literal["celsius", "fahrenheit"]
    days: int = Field(ge=1, le=7)


class Stop(BaseModel):
    model_config = ConfigDict(extra="forbid")
    place: str = Field(max_length=8)


class Route(BaseModel):
    """Its schema has `$defs` (Stop) and `$ref`s, which the call schema must keep resolvable."""

    model_config = ConfigDict(extra="forbid")
    stops: list[Stop] = Field(max_length=3)
    fastest: bool


MODELS: dict[str, type[BaseModel]] = {"get_weather": Weather, "plan_route": Route}


def tool(name: str, **function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": MODELS[name].model_json_schema(), **function}}


TOOLS = [tool("get_weather", description="The weather in a city."), tool("plan_route")]


def offered(t: dict[str, Any]) -> dict[str, Any]:
    """A tool as templates get it: OpenAI's shape, name, description (if any), parameters."""
    function = t["function"]
    shown = {
        "name": function["name"],
        **({"description": function["description"]} if "description" in function else {}),
    }
    return {"type": "function", "function": {**shown, "parameters": function["parameters"]}}


def parse(tokenizer: Any, **body: Any) -> tuple[ChatCompletionsApi, GenerationRequest]:
    api = ChatCompletionsApi("m")
    request = api.parse({"messages": MESSAGES, "max_tokens": LIMITS.max_new_tokens, **body}, LIMITS, tokenizer)
    return api, request


def refusal(tokenizer: Any, **body: Any) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as excinfo:
        parse(tokenizer, **body)
    return excinfo.value


# -- the request ------------------------------------------------------------------------------


def test_a_tool_without_parameters_is_a_400_naming_them(tiny_tokenizer):
    ping = {"type": "function", "function": {"name": "ping", "description": "Ping."}}
    error = refusal(tiny_tokenizer, tools=[TOOLS[0], ping])
    assert error.param == "tools[1].function.parameters"
    assert "required" in error.message


@pytest.mark.parametrize(
    "parameters", [["city"], "object", {"type": "string"}], ids=["list", "string", "not-an-object"]
)
def test_parameters_that_are_no_object_schema_are_a_400(tiny_tokenizer, parameters):
    bad = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    assert refusal(tiny_tokenizer, tools=[bad]).param == "tools[0].function.parameters"


def test_a_named_choice_that_names_no_tool_is_a_400(tiny_tokenizer):
    named = {"type": "function", "function": {"name": "launch_rocket"}}
    error = refusal(tiny_tokenizer, tools=TOOLS, tool_choice=named)
    assert error.param == "tool_choice" and "launch_rocket" in error.message


@pytest.mark.parametrize("choice", ["auto", "required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_tool_choice_without_tools_is_a_400(tiny_tokenizer, choice):
    assert refusal(tiny_tokenizer, tool_choice=choice).param == "tool_choice"
    assert refusal(tiny_tokenizer, tools=[], tool_choice=choice).param == "tool_choice"


def test_tool_choice_none_without_tools_is_fine(tiny_tokenizer):
    _, request = parse(tiny_tokenizer, tool_choice="none")
    assert request.constraint is None


def test_two_tools_with_one_name_are_a_400(tiny_tokenizer):
    assert refusal(tiny_tokenizer, tools=[TOOLS[0], TOOLS[0]]).param == "tools[1].function.name"


def test_a_tool_of_another_type_is_a_400(tiny_tokenizer):
    custom = {"type": "custom", "custom": {"name": "grep"}}
    assert refusal(tiny_tokenizer, tools=[custom]).param.startswith("tools")


# -- the prompt -------------------------------------------------------------------------------


def test_the_fallback_template_offers_the_tools_and_renders_calls_and_results(tiny_tokenizer):
    assert not tiny_tokenizer.chat_template  # the tiny model has none: DEFAULT_CHAT_TEMPLATE
    history = [
        {"role": "system", "content": "Be brief."},
        *MESSAGES,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius", "days": 1}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"},
    ]
    _, request = parse(tiny_tokenizer, messages=history, tools=TOOLS)
    prompt = request.prompt
    assert prompt.startswith("<s>System: Be brief.\n\nYou have access to the following functions.")
    assert '{"name": function name, "parameters": dictionary of argument name and its value}' in prompt
    for t in TOOLS:
        assert "\n" + json.dumps(offered(t)) + "\n" in prompt  # each tool's JSON on its own line
    assert prompt.count("System:") == 1  # the system message joined the tools' turn
    assert "User: Weather in Paris?\n" in prompt
    assert (
        'Assistant: {"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius", "days": 1}}\n' in prompt
    )
    assert "Tool: 18 degrees\n" in prompt
    assert prompt.endswith("Assistant:")


def test_without_tools_or_with_choice_none_the_prompt_is_the_plain_chat(tiny_tokenizer):
    _, plain = parse(tiny_tokenizer)
    assert plain.prompt == "<s>User: Weather in Paris?\nAssistant:"
    _, none = parse(tiny_tokenizer, tools=TOOLS, tool_choice="none")
    assert none.prompt == plain.prompt and none.constraint is None


def with_template(tokenizer: Any, template: str) -> Any:
    other = copy.deepcopy(tokenizer)
    other.chat_template = template
    return other


PLAIN_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"


@pytest.mark.parametrize(
    "template",
    [PLAIN_TEMPLATE, "{# tools are not rendered #}" + PLAIN_TEMPLATE],
    ids=["never-mentions-tools", "renders-no-tools"],
)
def test_a_template_without_tool_support_is_a_400_naming_tools(tiny_tokenizer, template):
    tokenizer = with_template(tiny_tokenizer, template)
    error = refusal(tokenizer, tools=TOOLS)
    assert error.param == "tools" and "does not support tools" in error.message
    _, request = parse(tokenizer, tools=TOOLS, tool_choice="none")  # not rendered: fine
    assert request.prompt == "user: Weather in Paris?\nassistant:"


def test_a_template_that_fails_on_tools_is_a_400_naming_tools(tiny_tokenizer):
    template = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}" + PLAIN_TEMPLATE
    error = refusal(with_template(tiny_tokenizer, template), tools=TOOLS)
    assert error.param == "tools" and "no tools here" in error.message


def test_a_tool_aware_template_gets_tools_and_history_in_transformers_shape(tiny_tokenizer):
    """Llama 3.1's template style: the tools dumped as JSON, `'tool_calls' in message`, and
    `arguments | tojson` (a dict, not the JSON text OpenAI sends)."""
    template = (
        "{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
        "{% for m in messages %}"
        "{% if 'tool_calls' in m %}call: {{ m.tool_calls[0].function.arguments | tojson }} id={{ m.tool_calls[0].id }}"
        "{% elif m.role == 'tool' %}result {{ m.tool_call_id }}: {{ m.content }}"
        "{% else %}{{ m.role }}: {{ m.content }}{% endif %}{{ '\\n' }}"
        "{% endfor %}assistant:"
    )
    call = {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    history = [
        *MESSAGES,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_9", "content": "-3"},
    ]
    _, request = parse(with_template(tiny_tokenizer, template), messages=history, tools=TOOLS[:1])
    assert request.prompt.splitlines() == [
        json.dumps(offered(TOOLS[0])),
        "user: Weather in Paris?",
        'call: {"city": "Oslo"} id=call_9',
        "result call_9: -3",
        "assistant:",
    ]


# -- the constraint ---------------------------------------------------------------------------


def test_only_required_or_a_named_function_constrains_and_tools_are_blamed(tiny_tokenizer):
    for choice in (None, "auto", "none"):
        api, request = parse(tiny_tokenizer, tools=TOOLS, **({} if choice is None else {"tool_choice": choice}))
        assert request.constraint is None, choice
    api, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice="required")
    assert request.constraint is not None and request.constraint.kind == "lark"  # parallel by default
    assert api.wire_name("constraint") == "tools"
    _, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice="required", parallel_tool_calls=False)
    assert request.constraint.kind == "json_schema"
    assert [o["properties"]["name"]["const"] for o in json.loads(request.constraint.value)["anyOf"]] == [
        "get_weather",
        "plan_route",
    ]
    named = {"type": "function", "function": {"name": "plan_route"}}
    _, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice=named)
    assert request.constraint.kind == "json_schema"
    assert json.loads(request.constraint.value)["properties"]["name"] == {"const": "plan_route"}


def test_auto_keeps_response_format_and_required_replaces_it(tiny_tokenizer):
    fmt = {"type": "json_object"}
    api, request = parse(tiny_tokenizer, tools=TOOLS, response_format=fmt)
    assert request.constraint.kind == "json_object" and api.wire_name("constraint") == "response_format"
    api, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice="required", response_format=fmt)
    assert request.constraint.kind == "lark" and api.wire_name("constraint") == "tools"


def test_a_parameters_schema_the_engine_cannot_enforce_is_blamed_on_tools(tiny_tokenizer):
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "$ref": "#/nowhere"}}}
    api, request = parse(tiny_tokenizer, tools=[bad], tool_choice="required")
    assert grammar_problem(request.constraint) is not None
    assert api.wire_name("constraint") == "tools"


def generate(
    masks: GrammarMasks, constraint: Any, eos: int, generator: torch.Generator, limit: int = LIMITS.max_new_tokens - 1
) -> list[int]:
    """Tokens the grammar allows, the best of random logits at each step, until EOS."""
    masks.add(0, constraint)
    try:
        ids: list[int] = []
        for _ in range(limit):
            scores = torch.randn(1, masks.vocab_size, generator=generator)
            masks.mask(scores, [0], [0])
            token = int(torch.argmax(scores))
            if token == eos:
                return ids
            ids.append(token)
            masks.advance([0], [token])
        raise AssertionError(f"no EOS within {limit} tokens")
    finally:
        masks.remove(0)


@pytest.mark.parametrize(
    ("choice", "parallel", "names"),
    [
        ("required", False, {"get_weather", "plan_route"}),
        ("required", True, {"get_weather", "plan_route"}),
        ({"type": "function", "function": {"name": "plan_route"}}, True, {"plan_route"}),
    ],
    ids=["required-one", "required-parallel", "named"],
)
def test_constrained_random_output_is_always_valid_calls(tiny_tokenizer, choice, parallel, names):
    api, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel)
    eos = tiny_tokenizer.eos_token_id
    masks = GrammarMasks(tiny_tokenizer, len(tiny_tokenizer), [eos])
    generator = torch.Generator().manual_seed(21)
    counts = set()
    for _ in range(12):
        ids = generate(masks, request.constraint, eos, generator)
        body = json.loads(whole(api, request, tiny_tokenizer, ids + [eos]))
        choice_out = ChatCompletion.model_validate(body).choices[0]
        assert choice_out.finish_reason == "tool_calls", tiny_tokenizer.decode(ids)
        assert choice_out.message.content is None
        calls = choice_out.message.tool_calls
        counts.add(len(calls))
        for call in calls:
            assert call.function.name in names
            MODELS[call.function.name].model_validate(json.loads(call.function.arguments))
    if not parallel:
        assert counts == {1}


# -- the response -----------------------------------------------------------------------------


def sequence_for(request: GenerationRequest, tokenizer: Any, choice_index: int = 0) -> Sequence:
    prompt_ids = tokenizer.encode(request.prompt, add_special_tokens=False)
    sequence = Sequence(request, prompt_ids, tokenizer, frozenset({tokenizer.eos_token_id}), "req-1")
    sequence.choice_index = choice_index
    return sequence


def tokens_of(text: str, tokenizer: Any, eos: bool = True) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False) + ([tokenizer.eos_token_id] if eos else [])


def whole(api: ChatCompletionsApi, request: GenerationRequest, tokenizer: Any, ids: list[int]) -> str:
    sequence = sequence_for(request, tokenizer)
    for token in ids:
        assert not sequence.finished
        sequence.append(token)
    assert sequence.finished
    return api.final(sequence)


def streamed(
    api: ChatCompletionsApi, request: GenerationRequest, tokenizer: Any, ids: list[int], logprob: float | None = None
) -> list[dict[str, Any]]:
    """The events of a streamed response, one token per step as the engine feeds them."""
    sequence = sequence_for(request, tokenizer)
    raw = ""
    for token in ids:
        assert not sequence.finished
        delta = sequence.take(TokenChoice(token, logprob)) if logprob is not None else sequence.append(token)
        if delta and not sequence.finished:
            raw += api.chunk(sequence, delta)
        elif sequence.finished:
            raw += (api.chunk(sequence, delta) if delta else "") + api.final(sequence)
    return sse_events(raw)


def sse_events(raw: str) -> list[dict[str, Any]]:
    blocks = raw.split("\n\n")
    assert blocks[-1] == "" and blocks[-2] == "data: [DONE]"
    return [json.loads(b.removeprefix("data: ")) for b in blocks[:-2]]


def accumulate(events: list[dict[str, Any]], input_tools: list[dict[str, Any]] | None = None):
    """The official client's accumulator over the chunks, as `chat.completions.stream` uses it."""
    state = ChatCompletionStreamState(input_tools=input_tools) if input_tools else ChatCompletionStreamState()
    for event in events:
        state.handle_chunk(ChatCompletionChunk.model_validate(event))
    return state.get_final_completion()


TWO_CALLS = (
    '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius", "days": 2}}; '
    '{"name": "plan_route", "parameters": {"stops": [{"place": "Lyon"}], "fastest": true}}'
)
EXPECTED = [
    ("get_weather", {"city": "Paris", "unit": "celsius", "days": 2}),
    ("plan_route", {"stops": [{"place": "Lyon"}], "fastest": True}),
]


def calls_of(message: Any) -> list[tuple[str, Any]]:
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


@pytest.mark.parametrize("choice", ["auto", "required"])
def test_a_whole_response_carries_tool_calls_and_finish_reason_tool_calls(tiny_tokenizer, choice):
    api, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice=choice)
    body = json.loads(whole(api, request, tiny_tokenizer, tokens_of(TWO_CALLS, tiny_tokenizer)))
    out = ChatCompletion.model_validate(body).choices[0]
    assert out.finish_reason == "tool_calls"
    assert out.message.content is None and body["choices"][0]["message"]["content"] is None
    assert calls_of(out.message) == EXPECTED
    for call in body["choices"][0]["message"]["tool_calls"]:
        assert set(call) == {"id", "type", "function"} and call["type"] == "function"
        assert call["id"].startswith("call_") and len(call["id"]) == 29


def test_auto_text_stays_content_with_the_usual_finish_reason(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS)
    text = '{"name": "send_mail", "parameters": {}}'  # no such tool
    body = json.loads(whole(api, request, tiny_tokenizer, tokens_of(text, tiny_tokenizer)))
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": text}


def test_tool_choice_none_never_parses_calls(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS, tool_choice="none")
    body = json.loads(whole(api, request, tiny_tokenizer, tokens_of(TWO_CALLS, tiny_tokenizer)))
    assert body["choices"][0]["message"]["content"] == TWO_CALLS and body["choices"][0]["finish_reason"] == "stop"


def test_a_call_cut_short_ends_with_length(tiny_tokenizer):
    cut = len(tokens_of('{"name": "get_weather", "parameters": {"city": "Pa', tiny_tokenizer, eos=False))
    api, request = parse(tiny_tokenizer, tools=TOOLS, max_tokens=cut)
    ids = tokens_of(TWO_CALLS, tiny_tokenizer, eos=False)[:cut]
    body = json.loads(whole(api, request, tiny_tokenizer, ids))
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


@pytest.mark.parametrize("text", [TWO_CALLS, "<|python_tag|>" + TWO_CALLS, " \n" + TWO_CALLS.replace("; ", ";\n")])
def test_streamed_tool_calls_reassemble_in_the_official_client(tiny_tokenizer, text):
    api, request = parse(tiny_tokenizer, tools=TOOLS, stream=True)
    events = streamed(api, request, tiny_tokenizer, tokens_of(text, tiny_tokenizer))
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0]["role"] == "assistant" and deltas[0]["content"] is None
    heads = [d["tool_calls"][0] for d in deltas if d.get("tool_calls") and "id" in d["tool_calls"][0]]
    assert [(h["index"], h["type"], h["function"]) for h in heads] == [
        (0, "function", {"name": "get_weather", "arguments": ""}),
        (1, "function", {"name": "plan_route", "arguments": ""}),
    ]
    fragments = [d for d in deltas if d.get("tool_calls") and "id" not in d["tool_calls"][0]]
    assert len(fragments) > 4  # the arguments came in pieces, as the model wrote them
    assert all(set(d["tool_calls"][0]) == {"index", "function"} for d in fragments)
    assert not any(d.get("content") for d in deltas)
    finishes = [e["choices"][0]["finish_reason"] for e in events]
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}

    strict = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]
    final = accumulate(events, strict).choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content is None
    assert calls_of(final.message) == EXPECTED
    assert [c.function.parsed_arguments for c in final.message.tool_calls] == [args for _, args in EXPECTED]
    assert len({c.id for c in final.message.tool_calls}) == 2

    whole_api, whole_request = parse(tiny_tokenizer, tools=TOOLS)
    body = json.loads(whole(whole_api, whole_request, tiny_tokenizer, tokens_of(text, tiny_tokenizer)))
    whole_message = ChatCompletion.model_validate(body).choices[0].message
    assert [(c.function.name, c.function.arguments) for c in whole_message.tool_calls] == [
        (c.function.name, c.function.arguments) for c in final.message.tool_calls
    ]  # streamed and whole: the same arguments text


def test_streamed_auto_text_is_content_as_usual(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS, stream=True)
    text = " The weather is fine; {no call}"
    events = streamed(api, request, tiny_tokenizer, tokens_of(text, tiny_tokenizer))
    final = accumulate(events).choices[0]
    assert final.message.content == text and not final.message.tool_calls
    assert final.finish_reason == "stop"
    assert len(events) > 3  # it streamed, not held to the end


def test_streamed_call_then_text_gives_both(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS, stream=True)
    text = TWO_CALLS.split("; ")[0] + "\nDone."
    final = accumulate(streamed(api, request, tiny_tokenizer, tokens_of(text, tiny_tokenizer))).choices[0]
    assert calls_of(final.message) == EXPECTED[:1]
    assert final.message.content == "\nDone." and final.finish_reason == "tool_calls"


def test_streamed_logprobs_cover_every_token_once(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS, stream=True, logprobs=True)
    ids = tokens_of(TWO_CALLS + "\nok", tiny_tokenizer)
    events = streamed(api, request, tiny_tokenizer, ids, logprob=-0.5)
    sent = [t for e in events for t in (e["choices"][0]["logprobs"] or {}).get("content", [])]
    assert len(sent) == len(ids) - 1  # every token but EOS, once
    assert "".join(t["token"] for t in sent) == TWO_CALLS + "\nok"


def test_several_choices_keep_their_own_tool_call_state(tiny_tokenizer):
    api, request = parse(tiny_tokenizer, tools=TOOLS, stream=True, n=2)
    sequences = [sequence_for(request, tiny_tokenizer, i) for i in range(2)]
    outputs = [tokens_of(TWO_CALLS, tiny_tokenizer), tokens_of("Just text.", tiny_tokenizer)]
    raw = ""
    for step in range(max(map(len, outputs))):
        for sequence, ids in zip(sequences, outputs, strict=True):
            if step < len(ids):
                delta = sequence.append(ids[step])
                raw += api.chunk(sequence, delta) if delta else ""
                raw += api.finish(sequence) if sequence.finished else ""
    raw += api.close(sequences)
    final = accumulate(sse_events(raw))
    first, second = final.choices
    assert calls_of(first.message) == EXPECTED and first.finish_reason == "tool_calls"
    assert second.message.content == "Just text." and not second.message.tool_calls
    assert second.finish_reason == "stop"
    assert sequences[0].finish_reason is FinishReason.EOS
