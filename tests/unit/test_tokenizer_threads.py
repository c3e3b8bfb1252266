"""One tokenizer, shared by every thread without a lock (handler/serving/service.py).

HF fast tokenizers are Rust objects: encoding and decoding only read them, and are safe from many
threads. Changing truncation or padding writes to the object: with another thread inside it that
raises "Already borrowed" (transformers 4.48) or silently encodes with the other call's settings
(transformers 5). So: (1) the calls the handler makes, from many threads at once, give exactly the
single-threaded answers; (2) the handler never makes a call that changes those settings."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

from handler.backends.tokenizer import load_tokenizer

HANDLER = Path(__file__).resolve().parents[2] / "handler"
MUTATING_KEYWORDS = {"truncation", "padding", "max_length", "pad_to_multiple_of", "stride"}
THREADS, ROUNDS = 16, 200


def test_the_handlers_tokenizer_calls_from_many_threads_match_one_thread(tiny_model_dir):
    tokenizer = load_tokenizer(tiny_model_dir, False)
    texts = [f"Request {i}: the quick brown fox jumps over the lazy dog. " * (1 + i % 5) for i in range(40)]
    messages = [[{"role": "user", "content": text}] for text in texts]

    def calls(i: int) -> tuple:
        """What prepare, the detokenizer, logprobs and TGI do: encode with or without special tokens,
        decode skipping special tokens or not, one token alone, a chat template rendered to text."""
        ids = tokenizer(texts[i], add_special_tokens=bool(i % 2))["input_ids"]
        return (
            ids,
            tokenizer.decode(ids, skip_special_tokens=True),
            tokenizer.decode(ids[-4:], skip_special_tokens=False),
            tokenizer.decode([ids[-1]], skip_special_tokens=False),
            tokenizer.apply_chat_template(messages[i], tokenize=False, add_generation_prompt=True)
            if tokenizer.chat_template
            else None,
        )

    want = [calls(i) for i in range(len(texts))]
    errors: list[str] = []
    wrong: list[int] = []

    def worker(k: int) -> None:
        for r in range(ROUNDS):
            i = (k * 7 + r) % len(texts)
            try:
                if calls(i) != want[i]:
                    wrong.append(i)
            except Exception as exc:  # "Already borrowed" would land here
                errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert not wrong, f"{len(wrong)} of {THREADS * ROUNDS} calls answered differently from one thread"


def test_the_handler_never_changes_a_shared_tokenizers_settings():
    """A call with truncation or padding arguments writes to the shared tokenizer: not safe
    without a lock, so none may appear in handler/."""
    found = []
    for path in sorted(HANDLER.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                bad = MUTATING_KEYWORDS & {k.arg for k in node.keywords if k.arg}
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if bad or name in ("enable_truncation", "enable_padding", "no_truncation", "no_padding"):
                    found.append(f"{path.relative_to(HANDLER.parent)}:{node.lineno} {name}({', '.join(sorted(bad))})")
    assert not found, found
