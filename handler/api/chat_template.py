"""Chat messages (and tools) -> one prompt string, with the tokenizer's own chat template.

A rendered template carries its own special tokens (Llama's starts with `<s>`), so a
chat prompt is tokenized without adding them again (`add_special_tokens=False`).
A tokenizer without a template (a base model, the tiny test model) gets a plain one
that still marks whose turn it is and ends with the assistant's cue; given tools, it lists
them in a first `System:` turn and asks for Llama 3.1's JSON calls (`{"name": ...,
"parameters": ...}`, several separated by "; "), which the default tool parser reads.

Tools go through transformers' `apply_chat_template(..., tools=...)`. A template that ignores
them (the prompt is the same with and without) cannot offer them to the model: a 400 naming
`tools`, not a request that silently never calls a tool.
"""

from __future__ import annotations

from typing import Any

from handler.errors import EngineError, InvalidRequest

TOOLS_INSTRUCTION = (
    "You have access to the following functions. To call a function, respond with only a JSON object "
    'of the form {"name": function name, "parameters": dictionary of argument name and its value}; '
    'to call several, separate the objects with "; ". Do not use variables.'
)

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% if tools %}"
    "System: {% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    + TOOLS_INSTRUCTION
    + "\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{% if message['role'] == 'assistant' and message['tool_calls'] %}"
    "Assistant: {% for call in message['tool_calls'] %}"
    "{{ ({'name': call['function']['name'], 'parameters': call['function']['arguments']}) | tojson }}"
    "{% if not loop.last %}; {% endif %}"
    "{% endfor %}{{ '\\n' }}"  # not a bare newline: the template engine trims the one after a block tag
    "{% else %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
    "{% endif %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The prompt for `messages` (offering `tools`, OpenAI-shaped, when given), ending where the
    assistant's reply begins."""
    if tokenizer is None:
        raise EngineError("chat completions need the model's tokenizer, and none was given", "messages")
    template = None if getattr(tokenizer, "chat_template", None) else DEFAULT_CHAT_TEMPLATE
    if not tools:
        return _render(tokenizer, messages, template, None, "messages")
    try:
        prompt = _render(tokenizer, messages, template, tools, "tools")
    except InvalidRequest:
        _render(tokenizer, messages, template, None, "messages")  # the messages' own problem, if any
        raise
    if _mentions_tools(template or tokenizer.chat_template):
        try:
            bare = _render(tokenizer, messages, template, None, "messages")
        except InvalidRequest:  # it renders only with tools: it uses them
            return prompt
        if prompt != bare:
            return prompt
    raise InvalidRequest(
        "the model's chat template does not support tools (it renders the same prompt without them); "
        "send the request without 'tools' (or with tool_choice 'none'), or serve the model with a "
        "tool-aware chat template",
        "tools",
    )


def _render(
    tokenizer: Any, messages: list[dict[str, Any]], template: str | None, tools: list[dict[str, Any]] | None, param: str
) -> str:
    try:
        prompt = tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True, chat_template=template
        )
    except Exception as exc:  # jinja's TemplateError, or a template's raise_exception(...)
        what = "the messages and tools" if tools else "the messages"
        raise InvalidRequest(f"{what} do not fit the model's chat template: {exc}", param) from None
    if not isinstance(prompt, str):
        raise EngineError(f"the chat template rendered a {type(prompt).__name__}, not text", param)
    return prompt


def _mentions_tools(template: Any) -> bool:
    """Whether a template's source (or any of a tokenizer's named templates) reads `tools` at all."""
    if isinstance(template, dict):
        return any(_mentions_tools(t) for t in template.values())
    return not isinstance(template, str) or "tools" in template
