"""Stop strings, max_tokens, n and seed on real text: the model counts, and the controls cut
the greedy answer exactly where they say; sampled outputs differ and a seed repeats them."""

from __future__ import annotations

from typing import Any

COUNT = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]


def chat(server, client, messages: list[dict[str, str]], **fields: Any) -> Any:
    fields.setdefault("temperature", 0)
    return client.chat.completions.create(model=server.model_name, messages=messages, **fields)


def test_a_stop_string_in_the_greedy_answer_ends_the_text_before_it(real_server, real_client):
    full = chat(real_server, real_client, COUNT, max_tokens=60)
    full_text = full.choices[0].message.content
    print(f"count: {full_text!r} ({full.choices[0].finish_reason})")
    assert "1, 2, 3, 4, 5" in full_text  # the model counts, so ", 5" is in its greedy answer
    assert full.choices[0].finish_reason == "stop"

    stopped = chat(real_server, real_client, COUNT, max_tokens=60, stop=[", 5", "never in the text"])
    [choice] = stopped.choices
    print(f"count, stop ', 5': {choice.message.content!r} ({choice.finish_reason})")
    assert choice.message.content == full_text[: full_text.index(", 5")]
    assert choice.message.content.endswith("4")
    assert choice.finish_reason == "stop"
    assert stopped.usage.completion_tokens < full.usage.completion_tokens


def test_max_tokens_cuts_the_greedy_answer_after_exactly_that_many_tokens(real_server, real_client):
    full = chat(real_server, real_client, COUNT, max_tokens=60, logprobs=True).choices[0]
    tokens = [entry.token for entry in full.logprobs.content]  # each generated token's text, EOS not listed
    assert "".join(tokens) == full.message.content
    for n in (1, 7):
        cut = chat(real_server, real_client, COUNT, max_tokens=n)
        [choice] = cut.choices
        print(f"count, max_tokens {n}: {choice.message.content!r} ({choice.finish_reason})")
        assert cut.usage.completion_tokens == n
        assert choice.finish_reason == "length"
        assert choice.message.content == "".join(tokens[:n])  # the greedy answer's first n tokens


def test_n_with_a_seed_gives_different_answers_and_the_seed_repeats_them(real_server, real_client):
    fields: dict[str, Any] = {"max_tokens": 24, "temperature": 1.0, "n": 2, "seed": 1234}
    first = chat(real_server, real_client, POEM, **fields)
    again = chat(real_server, real_client, POEM, **fields)
    answers = [choice.message.content for choice in first.choices]
    for i, text in enumerate(answers):
        print(f"poem, seed 1234, choice {i}: {text!r}")
    assert [choice.index for choice in first.choices] == [0, 1]
    assert all(answers) and answers[0] != answers[1]
    assert [choice.message.content for choice in again.choices] == answers
    assert 2 <= first.usage.completion_tokens <= 2 * 24

    # choice i samples with seed + i: choice 1 is the n=1 answer of seed 1235 (docs/openai.md)
    alone = chat(real_server, real_client, POEM, max_tokens=24, temperature=1.0, seed=1235)
    assert alone.choices[0].message.content == answers[1]
