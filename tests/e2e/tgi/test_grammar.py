"""TGI's `grammar` parameter (issue 21) through huggingface_hub's `InferenceClient.text_generation`,
unmodified, against a real torchserve serving the tiny random model, in both scheduling modes:
a JSON Schema and a regular expression, streamed and not, every output valid (the random model
alone never writes either); a regex the engine cannot compile is TGI's 422 naming `grammar`;
`frequency_penalty` is honoured."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import ValidationError
from huggingface_hub.inference._generated.types import TextGenerationInputGrammarType

from tests.support.structured import PERSON_SCHEMA, assert_person

PROMPT = "Once upon a time"
REGEX = "[0-9]{3}-[a-z]{2}"
MAX_NEW_TOKENS = 100


def test_the_random_model_alone_matches_neither(client: InferenceClient):
    """The control: what the tests below see is the grammar's doing."""
    text = client.text_generation(PROMPT, max_new_tokens=30)
    assert not re.fullmatch(REGEX, text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


@pytest.mark.parametrize("seed", [None, 1], ids=["greedy", "sampled"])
def test_json_grammar_output_validates(client: InferenceClient, seed):
    grammar = {"type": "json", "value": PERSON_SCHEMA}
    sampling = {} if seed is None else {"do_sample": True, "seed": seed}
    out = client.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, grammar=grammar, details=True, **sampling)
    assert out.details.finish_reason == "eos_token", out.generated_text
    assert_person(out.generated_text)


def test_streamed_json_grammar_output_is_the_same_valid_document(client: InferenceClient):
    grammar = {"type": "json", "value": PERSON_SCHEMA}
    pieces = list(client.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, grammar=grammar, stream=True))
    assert len(pieces) > 2  # it did stream
    assert_person("".join(pieces))
    assert "".join(pieces) == client.text_generation(PROMPT, max_new_tokens=MAX_NEW_TOKENS, grammar=grammar)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_regex_grammar_output_fullmatches(client: InferenceClient, stream: bool):
    grammar = TextGenerationInputGrammarType(type="regex", value=REGEX)
    out = client.text_generation(PROMPT, max_new_tokens=30, grammar=grammar, stream=stream, do_sample=True, seed=2)
    text = "".join(out) if stream else out
    assert re.fullmatch(REGEX, text), text


def test_a_regex_the_engine_cannot_compile_is_a_422_naming_grammar(server, generate_url: str, client):
    body = {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "grammar": {"type": "regex", "value": "[0-9"}}}
    response = httpx.post(generate_url, json=body, headers=server.headers, timeout=60)
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["error_type"] == "validation" and "grammar" in error["error"], error
    with pytest.raises(ValidationError, match="grammar"):
        client.text_generation(PROMPT, max_new_tokens=8, grammar={"type": "regex", "value": "[0-9"})
    assert client.text_generation(PROMPT, max_new_tokens=2)  # still serving


def test_frequency_penalty_changes_the_greedy_text(client: InferenceClient):
    free = client.text_generation(PROMPT, max_new_tokens=48, details=True)
    ids = [t.id for t in free.details.tokens]
    assert len(set(ids)) < len(ids), "the greedy text repeats no token: a penalty could not change it"
    penalized = client.text_generation(PROMPT, max_new_tokens=48, frequency_penalty=2.0, details=True)
    assert penalized.generated_text != free.generated_text
    first_repeat = next(i for i, t in enumerate(ids) if t in ids[:i])
    assert [t.id for t in penalized.details.tokens][:first_repeat] == ids[:first_repeat]
