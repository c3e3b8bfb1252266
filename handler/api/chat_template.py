"""Chat messages -> one prompt string, with the tokenizer's own chat template.

A rendered template carries its own special tokens (Llama's starts with `<s>`), so a
chat prompt is tokenized without adding them again (`add_special_tokens=False`).
A tokenizer without a template (a base model, the tiny test model) gets a plain one
that still marks whose turn it is and ends with the assistant's cue.
"""

from __future__ import annotations

from typing import Any

from handler.errors import EngineError, InvalidRequest

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "{{ message['role'] | capitalize }}: {{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]]) -> str:
    """The prompt for `messages`, ending where the assistant's reply begins."""
    if tokenizer is None:
        raise EngineError("chat completions need the model's tokenizer, and none was given", "messages")
    template = None if getattr(tokenizer, "chat_template", None) else DEFAULT_CHAT_TEMPLATE
    try:
        prompt = tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, chat_template=template
        )
    except Exception as exc:  # jinja's TemplateError, or a template's raise_exception(...)
        raise InvalidRequest(f"the messages do not fit the model's chat template: {exc}", "messages") from None
    if not isinstance(prompt, str):
        raise EngineError(f"the chat template rendered a {type(prompt).__name__}, not text", "messages")
    return prompt
