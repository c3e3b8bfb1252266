"""A rendered chat template carries its own BOS: the service must not add a second one.

The tiny tokenizer adds no BOS by itself, so here a Llama-like wrapper adds one (as
Llama's tokenizers do) and the service's prepare stage is run on its own.
"""

from __future__ import annotations

from typing import Any

import pytest

from handler.backends.base import Backend
from handler.config import ServingConfig
from handler.serving.service import GenerationService


class BosAddingTokenizer:
    """The tiny tokenizer, but `add_special_tokens=True` prepends BOS, like Llama's."""

    chat_template = None

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __call__(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> dict[str, list[int]]:
        ids = self._inner(text, add_special_tokens=False, **kwargs)["input_ids"]
        return {"input_ids": [self._inner.bos_token_id, *ids] if add_special_tokens else ids}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class PrepareOnlyBackend(Backend):
    name = "prepare-only"
    n_positions = 256

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = frozenset({tokenizer.eos_token_id})

    n_slots = 1

    def prefill(self, requests):
        raise AssertionError("prepare only")

    def decode(self, slots):
        raise AssertionError("prepare only")

    def release(self, slot):
        raise AssertionError("prepare only")


class Context:
    model_name = "m"

    def __init__(self, url_path: str) -> None:
        self.url_path = url_path

    def get_request_id(self, index: int) -> str:
        return f"req-{index}"

    def get_request_header(self, index: int, key: str) -> str | None:
        return self.url_path if key == "url_path" else None


@pytest.fixture
def service(tiny_tokenizer) -> GenerationService:
    config = ServingConfig.from_model_yaml(
        {
            "continuousBatching": True,
            "batchSize": 8,
            "handler": {
                "model_checkpoint_dir": "unused",
                "n_positions": 256,
                "default_max_new_tokens": 16,
                "max_new_tokens": 64,
            },
        }
    )
    return GenerationService(config, PrepareOnlyBackend(BosAddingTokenizer(tiny_tokenizer)))


def prompt_ids(service: GenerationService, url_path: str, body: dict) -> list[int]:
    work = service.prepare(0, {"body": body}, Context(url_path))
    assert work.error is None, work.error
    return work.sequence.prompt_ids


def test_chat_prompt_has_exactly_one_bos(service, tiny_tokenizer):
    ids = prompt_ids(service, "v1/chat/completions", {"messages": [{"role": "user", "content": "Hello"}]})
    bos = tiny_tokenizer.bos_token_id
    assert ids[0] == bos and ids.count(bos) == 1
    assert tiny_tokenizer.decode(ids) == "<s>User: Hello\nAssistant:"


def test_completion_prompt_gets_the_tokenizers_bos(service, tiny_tokenizer):
    ids = prompt_ids(service, "v1/completions", {"prompt": "Hello"})
    assert ids == [tiny_tokenizer.bos_token_id, *tiny_tokenizer("Hello", add_special_tokens=False)["input_ids"]]


def test_models_route_skips_parsing_and_generation(service):
    work = service.prepare(0, {}, Context("v1/models"))  # a GET: no body at all
    assert work.sequence is None and work.error is None and '"id":"m"' in work.reply
