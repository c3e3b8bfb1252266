"""The official `openai` client asking for logprobs against a real torchserve: completions with
`logprobs` + `echo` (lm-eval's loglikelihood request), streamed and not, a token-id prompt,
chat `logprobs` / `top_logprobs`, and the 400s, with the values checked against the tiny
model's own log-softmax."""

from __future__ import annotations

import openai
import pytest

TOL = 1e-4


@pytest.fixture(scope="module")
def client(openai_base_url: str, api_key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=openai_base_url, api_key=api_key, max_retries=0, timeout=60)


def test_loglikelihood_request_as_lm_eval_sends_it(client, server, tiny_tokenizer, model_log_softmax):
    ids = tiny_tokenizer("Once upon a time there was a cat")["input_ids"]
    out = client.completions.create(
        model=server.model_name, prompt=[ids], max_tokens=1, logprobs=1, echo=True, temperature=0, seed=1234
    )
    lp = out.choices[0].logprobs
    assert len(lp.token_logprobs) == len(ids) + 1 == len(lp.tokens) == len(lp.top_logprobs) == len(lp.text_offset)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    ref = model_log_softmax(ids)
    for i in range(1, len(ids)):
        assert lp.token_logprobs[i] == pytest.approx(float(ref[i - 1, ids[i]]), abs=TOL)
    assert lp.token_logprobs[-1] == pytest.approx(float(ref[-1].max()), abs=TOL)
    assert lp.token_logprobs[-1] == max(lp.top_logprobs[-1].values())  # greedy: the same float
    assert out.choices[0].text.startswith(tiny_tokenizer.decode(ids, skip_special_tokens=True))


def test_streamed_echo_logprobs_equal_the_whole_answer(client, server):
    kwargs = {
        "model": server.model_name,
        "prompt": "Today the weather is",
        "max_tokens": 80,
        "logprobs": 3,
        "extra_body": {"ignore_eos": True},
    }
    whole = client.completions.create(echo=True, temperature=0, **kwargs)
    chunks = list(client.completions.create(echo=True, temperature=0, stream=True, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    tokens, token_logprobs, offsets = [], [], []
    for c in chunks:
        if c.choices and c.choices[0].logprobs is not None:
            tokens += c.choices[0].logprobs.tokens
            token_logprobs += c.choices[0].logprobs.token_logprobs
            offsets += c.choices[0].logprobs.text_offset
    lp = whole.choices[0].logprobs
    assert text == whole.choices[0].text and text.startswith("Today the weather is")
    assert (tokens, token_logprobs, offsets) == (lp.tokens, lp.token_logprobs, lp.text_offset)
    assert len(chunks) > 2  # it did stream


def test_chat_logprobs(client, server):
    request = {
        "model": server.model_name,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": 5,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
        "extra_body": {"ignore_eos": True},
    }
    out = client.chat.completions.create(**request)
    content = out.choices[0].logprobs.content
    assert len(content) == 5
    assert all(len(entry.top_logprobs) == 2 and entry.bytes == list(entry.token.encode()) for entry in content)
    assert all(entry.top_logprobs[0].logprob == entry.logprob for entry in content)  # greedy
    streamed = client.chat.completions.create(**request, stream=True)
    streamed_content = [
        e for c in streamed if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.logprob) for e in streamed_content] == [(e.token, e.logprob) for e in content]


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [1, 10**6]}, "prompt"),
        ({"prompt": "hi", "logprobs": 6}, "logprobs"),
    ],
)
def test_bad_requests_are_400_naming_the_field(client, server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=server.model_name, max_tokens=2, **kwargs)
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param
