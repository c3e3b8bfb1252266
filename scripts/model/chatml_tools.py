"""SmolLM2's ChatML chat template, extended to offer tools.

The template in SmolLM2-135M-Instruct's GGUF ignores `tools`, so the OpenAI routes refuse a
request with tools (handler/api/chat_template.py: a template that cannot show the model its
tools would make it call blind). This one renders exactly what the original renders when no
tools are sent (checked at conversion, `same_without_tools`); with tools, the system turn lists
them after the handler's own tool instruction (the JSON call format the tool-call parser
reads), an assistant turn's `tool_calls` are written back in that format, and a tool's result
is a user turn that says what it is (below).
"""

from __future__ import annotations

from typing import Any

from handler.api.chat_template import TOOLS_INSTRUCTION

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
# A tool's result, as a user turn: SmolLM2 never saw a `tool` role, and given one (or the bare
# result as a user turn) the 135M model calls the tool again or describes it; told what the
# result is for, it answers with it ("The weather in Tokyo is sunny.").
TOOL_RESULT_BEFORE = "The function returned: "
TOOL_RESULT_AFTER = "\\nAnswer the question with it."

CHATML_WITH_TOOLS = (
    # The system turn: the caller's or SmolLM2's default; with tools, the tools after it.
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{%- else %}" + DEFAULT_SYSTEM + "{%- endif %}"
    "{{ '\\n\\n' }}" + TOOLS_INSTRUCTION + "{{ '\\n' }}"
    "{%- for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\n" + DEFAULT_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    # Every turn (the system turn already written when there are tools).
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message['role'] == 'system') %}"
    "{%- if message['role'] == 'tool' %}"
    "{{ '<|im_start|>user\\n" + TOOL_RESULT_BEFORE + "' + message['content'] + '" + TOOL_RESULT_AFTER + "' }}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' and message['tool_calls'] %}"
    "{%- for call in message['tool_calls'] %}"
    "{{ {'name': call['function']['name'], 'parameters': call['function']['arguments']} | tojson }}"
    "{%- if not loop.last %}{{ '; ' }}{%- endif %}"
    "{%- endfor %}"
    "{%- else %}{{ message['content'] }}{%- endif %}"
    "{%- endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

CONVERSATIONS = (
    [{"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "café 東京 🍣"}],
)


def same_without_tools(tokenizer: Any, original: str) -> None:
    """Raise unless CHATML_WITH_TOOLS renders every sample conversation as `original` does."""
    for messages in CONVERSATIONS:
        for generation_prompt in (False, True):
            ours, theirs = (
                tokenizer.apply_chat_template(
                    messages, chat_template=template, tokenize=False, add_generation_prompt=generation_prompt
                )
                for template in (CHATML_WITH_TOOLS, original)
            )
            if ours != theirs:
                raise SystemExit(f"the tools template renders {messages} differently:\n{ours!r}\n{theirs!r}")
