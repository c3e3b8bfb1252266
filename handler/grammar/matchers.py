"""The process's grammar matchers: llguidance's view of each tokenizer, and the compiled matcher
of each grammar, shared by the receipt check (handler/grammar/compiler.py) and the slots' masks
(handler/grammar/masks.py), so a grammar compiled on receipt is only copied in its prefill."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import llguidance
import llguidance.hf
import numpy as np

from handler.grammar.byte_lru import ByteLRU

# llguidance's max_grammar_size. Its matcher asserts fewer than 65,525 grammar symbols and panics
# past them (seen with 12,000 optional properties); below this limit it answers a plain error.
DEFAULT_MAX_SYMBOLS = 50_000
DEFAULT_CACHE_BYTES = 256 * 2**20
# What a compiled matcher holds, per character of its grammar: measured 14-20 bytes (RSS) for
# 1 MB enum schemas with the tiny tokenizer, and the worker's growth under 300 distinct ones
# (scripts/bench/memory.py) came to about 24; the lexer grows with the vocabulary, so this is an
# estimate, stated as one (docs/operations.md).
MATCHER_BYTES_PER_GRAMMAR_CHAR = 24
MATCHER_BASE_BYTES = 64 * 1024
PROBE_STEPS = 16  # tokens of a constraint walked on receipt (handler/grammar/compiler.py)
ERROR_LIMIT = 300  # characters of a grammar engine's error quoted back to the client
TRIM_AFTER_BYTES = 8 * 2**20  # evictions at least this large give the freed pages back to the OS

_lock = threading.Lock()
_views: dict[tuple[int, int | None, tuple[int, ...]], tuple[Any, Any]] = {}


def _give_back_freed_memory(evicted: int) -> None:
    """After large evictions, ask glibc to return the freed pages (llguidance allocates through it):
    without this the worker's RSS keeps the high-water mark of what the cache once held."""
    if evicted >= TRIM_AFTER_BYTES and _LIBC is not None:
        _LIBC.malloc_trim(0)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim  # noqa: B018 - glibc only
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
# Grammar texts (handler/grammar/grammars.py) and compiled matchers, in one budget per process.
cache = ByteLRU(DEFAULT_CACHE_BYTES, _give_back_freed_memory)


def configure(cache_bytes: int) -> None:
    """The process's budget for what requests' constraints leave cached (`handler.grammar.cache_mb`)."""
    cache.resize(cache_bytes)


def limits(max_symbols: int) -> llguidance.LLParserLimits:
    # verbose_errors off: an error must not carry the grammar or the parser's state.
    return llguidance.LLParserLimits(max_grammar_size=max_symbols, verbose_errors=False)


def tokenizer_view(tokenizer: Any, vocab_size: int | None, eos_token_ids: Sequence[int]) -> Any:
    """llguidance's view of a Hugging Face tokenizer (seconds to build at a 128k vocabulary; built
    once per process); None without a tokenizer. Raises what llguidance raises for one it cannot read."""
    if tokenizer is None:
        return None
    eos = tuple(sorted(eos_token_ids))
    key = (id(tokenizer), vocab_size, eos)
    with _lock:
        entry = _views.get(key)
    if entry is None:
        view = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos) or None)
        with _lock:
            entry = _views.setdefault(key, (tokenizer, view))  # the tokenizer is kept: its id stays unique
    return entry[1]


def compiled(view: Any, grammar: str, max_symbols: int = DEFAULT_MAX_SYMBOLS) -> Any:
    """The compiled matcher of `grammar` (copy it before use: it is shared). Raises ValueError with
    the grammar engine's reason when the grammar does not compile within the limits."""
    key = ("matcher", id(view), grammar)
    matcher = cache.get(key)
    if matcher is not None:
        return matcher
    matcher = llguidance.LLMatcher(view, grammar, log_level=0, limits=limits(max_symbols))  # GIL released
    if matcher.is_error():
        raise ValueError(error_gist(matcher.get_error()))
    cache.put(key, matcher, MATCHER_BASE_BYTES + MATCHER_BYTES_PER_GRAMMAR_CHAR * len(grammar))
    return matcher


def probe(compiled_matcher: Any, eos_token_ids: Sequence[int], steps: int = PROBE_STEPS) -> str | None:
    """Why the grammar cannot be followed to the end, found by walking its first `steps` tokens
    (always the lowest allowed token that is not EOS), or None. Catches schemas that refer to
    themselves with no way to stop (`{"$ref": "#"}`, a `$defs` cycle, a required property that is
    the root again): llguidance compiles them, then gives up at the first tokens of any output."""
    matcher = compiled_matcher.deep_copy()
    eos = np.asarray(sorted(eos_token_ids), dtype=np.int64)
    for _ in range(steps):
        bitmask = matcher.compute_bitmask()
        if matcher.is_error():
            return "the schema cannot be followed to the end (does it refer to itself with no way to stop?): " + (
                error_gist(matcher.get_error())
            )
        if matcher.is_stopped():
            return None
        allowed = np.flatnonzero(np.unpackbits(np.frombuffer(bitmask, dtype=np.uint8), bitorder="little"))
        progress = allowed[~np.isin(allowed, eos)]
        if not len(progress):
            return None  # only EOS is left: the output is complete
        matcher.consume_token(int(progress[0]))
    return None


def validate(grammar: str, max_symbols: int = DEFAULT_MAX_SYMBOLS) -> str | None:
    """Why the grammar alone (no tokenizer) cannot be compiled, None when it can."""
    error = llguidance.LLMatcher.validate_grammar(grammar, limits=limits(max_symbols))
    return error_gist(error) if error.strip() else None


def error_gist(message: str) -> str:
    """A grammar engine's error as one line for a client: its first line and the `error: ...` line
    a regex error puts under the quoted pattern (a Lark error goes on to quote the whole grammar);
    an internal failure (a Rust panic and its backtrace) as what it means, never its text."""
    if message.lstrip().startswith("panic"):
        return "the grammar is too large or complex for the grammar engine; simplify the schema"
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    gist = " ".join(lines[:1] + [line for line in lines[1:] if line.startswith("error:")])
    return gist if len(gist) <= ERROR_LIMIT else gist[: ERROR_LIMIT - 1] + "…"
