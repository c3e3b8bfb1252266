"""Benchmark client: stream requests at a running server under a load, measure what users see.

Loads (`--load`, repeatable, run in order):
  synchronous:N           one stream at a time, N requests
  concurrent:S:N          S streams, each sending its next request when the last ends
  constant:RATE:N         N requests at RATE req/s, evenly spaced
  poisson:RATE:N          N requests at RATE req/s, exponential gaps
  sweep:K:N               synchronous, then S=`--sweep-streams` concurrent streams, then K
                          Poisson rates spread between the two measured rates (N each)
Per load: requests ok / failed, TTFT, ITL, end-to-end latency (p50 / p90 / p99), output
tokens/s and requests/s. ITL per request is (last token time - first token time) /
(completion tokens - 1), as guidellm computes it; token counts come from `usage`.

    python -m scripts.bench.client --url http://127.0.0.1:8080 --model llama \\
        --load synchronous:20 --load concurrent:8:80 --load poisson:3.6:300 --out bench_results/run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from scripts.bench.stats import LoadSummary, arrival_offsets, format_table, summarize
from scripts.serve.client import auth_headers

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "scripts" / "model" / "corpus.txt"


# -- what to send ------------------------------------------------------------------------
@dataclass(frozen=True)
class Lengths:
    """Token lengths from a normal distribution (mean, spread), at least 1."""

    mean: int
    spread: int = 0

    def draw(self, rng: random.Random) -> int:
        return max(1, round(rng.gauss(self.mean, self.spread))) if self.spread else max(1, self.mean)


class PromptMaker:
    """Prompts of about N tokens, cut from the corpus at random offsets (so they differ)."""

    def __init__(self, tokenizer_dir: Path | None, seed: int) -> None:
        self.rng = random.Random(seed)
        text = CORPUS.read_text()
        self.tokenizer = None
        if tokenizer_dir is not None:
            from transformers import AutoTokenizer

            self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
            self.ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        else:
            self.words = text.split()

    def make(self, tokens: int) -> str:
        if self.tokenizer is None:  # no tokenizer: about one token per word
            start = self.rng.randrange(len(self.words))
            return " ".join(self.words[(start + i) % len(self.words)] for i in range(max(1, tokens - 1)))
        start = self.rng.randrange(len(self.ids))
        ids = [self.ids[(start + i) % len(self.ids)] for i in range(max(1, tokens - 1))]  # BOS is the last one
        return self.tokenizer.decode(ids)


@dataclass(frozen=True)
class Target:
    url: str
    model: str
    api: str  # native | openai
    headers: dict[str, str]
    ignore_eos: bool = True
    sampling: dict[str, Any] | None = None  # e.g. {"temperature": 0.8, "top_p": 0.9}; None: the route's default

    @property
    def endpoint(self) -> str:
        base = f"{self.url}/predictions/{self.model}"
        return base if self.api == "native" else f"{base}/1.0/v1/completions"

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        if self.api == "native":
            body = {"prompt": prompt, "max_new_tokens": max_tokens, "ignore_eos": self.ignore_eos, "stream": True}
            return body | (self.sampling or {})
        return (self.sampling or {}) | {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": self.ignore_eos,
        }


# -- one request -------------------------------------------------------------------------
@dataclass
class RequestResult:
    scheduled: float  # when the load wanted it sent (time.perf_counter)
    started: float = 0.0
    first_token: float | None = None
    last_token: float | None = None
    ended: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def _parse_event(api: str, line: str) -> tuple[str, dict[str, Any] | None, str | None, str | None]:
    """(text, usage, finish_reason, error) of one NDJSON line or SSE `data:` line."""
    if api == "openai":
        if not line.startswith("data:"):
            return "", None, None, None
        payload = line[5:].strip()
        if payload == "[DONE]":
            return "", None, None, None
        obj = json.loads(payload)
        choices = obj.get("choices") or [{}]
        error = obj.get("error")
        return choices[0].get("text") or "", obj.get("usage"), choices[0].get("finish_reason"), _message(error)
    obj = json.loads(line)
    return obj.get("text") or "", obj.get("usage"), obj.get("finish_reason"), _message(obj.get("error"))


def _message(error: Any) -> str | None:
    if error is None:
        return None
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


async def send(client: httpx.AsyncClient, target: Target, prompt: str, max_tokens: int, scheduled: float):
    result = RequestResult(scheduled=scheduled)
    headers = {**target.headers, "X-Request-Start": f"t={time.time():.6f}"}
    result.started = time.perf_counter()
    try:
        async with client.stream("POST", target.endpoint, json=target.body(prompt, max_tokens), headers=headers) as r:
            if r.status_code != 200:
                await r.aread()
                result.error = f"HTTP {r.status_code}: {r.text[:200]}"
            else:
                async for line in r.aiter_lines():
                    if not line.strip():
                        continue
                    text, usage, finish, error = _parse_event(target.api, line)
                    now = time.perf_counter()
                    if text:
                        result.first_token = result.first_token or now
                        result.last_token = now
                    if usage:
                        result.prompt_tokens = int(usage.get("prompt_tokens", 0))
                        result.completion_tokens = int(usage.get("completion_tokens", 0))
                    result.finish_reason = finish or result.finish_reason
                    if error:
                        result.error = error
                if result.error is None and not result.completion_tokens:
                    result.error = "no usage in the response"
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    result.ended = time.perf_counter()
    return result


# -- loads -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    kind: str  # synchronous | concurrent | constant | poisson
    requests: int
    streams: int = 1
    rate: float = 0.0  # req/s for constant / poisson
    label: str = ""  # the name in tables and results, instead of the generated one

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.kind == "synchronous":
            return "synchronous"
        if self.kind == "concurrent":
            return f"concurrent@{self.streams}"
        return f"{self.kind}@{self.rate:.2f}/s"


def parse_load(spec: str) -> Load | tuple[str, int, int]:
    """`kind:params:N`; a sweep is returned as ("sweep", K, N) and expanded at run time."""
    parts = spec.split(":")
    try:
        kind, nums = parts[0], [float(p) for p in parts[1:]]
        if kind == "synchronous" and len(nums) == 1:
            return Load("synchronous", int(nums[0]))
        if kind == "concurrent" and len(nums) == 2:
            return Load("concurrent", int(nums[1]), streams=int(nums[0]))
        if kind in ("constant", "poisson") and len(nums) == 2 and nums[0] > 0:
            return Load(kind, int(nums[1]), rate=nums[0])
        if kind == "sweep" and len(nums) == 2:
            return ("sweep", int(nums[0]), int(nums[1]))
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"bad load {spec!r}: use synchronous:N, concurrent:S:N, constant:RATE:N, poisson:RATE:N or sweep:K:N"
    )


@dataclass
class Workload:
    prompts: PromptMaker
    prompt_lengths: Lengths
    output_lengths: Lengths
    seed: int
    progress: bool = True
    _rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed + 1)

    def next(self) -> tuple[str, int]:
        return self.prompts.make(self.prompt_lengths.draw(self._rng)), self.output_lengths.draw(self._rng)


async def run_load(target: Target, load: Load, workload: Workload) -> list[RequestResult]:
    items = [workload.next() for _ in range(load.requests)]
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    timeout = httpx.Timeout(900.0, connect=30.0)
    bar = _progress(load, workload.progress)
    results: list[RequestResult] = []

    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:

        async def one(i: int, scheduled: float) -> None:
            result = await send(client, target, items[i][0], items[i][1], scheduled)
            results.append(result)
            bar(result)

        if load.kind in ("synchronous", "concurrent"):
            next_index = iter(range(load.requests))

            async def stream() -> None:
                for i in next_index:
                    await one(i, time.perf_counter())

            await asyncio.gather(*(stream() for _ in range(load.streams)))
        else:
            offsets = arrival_offsets(load.kind, load.rate, load.requests, workload.seed + 2)  # as bench_des
            start = time.perf_counter()
            tasks = []
            for i, offset in enumerate(offsets):
                delay = start + offset - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(i, start + offset)))
            await asyncio.gather(*tasks)
    bar(None)
    return results


def _progress(load: Load, enabled: bool) -> Callable[[RequestResult | None], None]:
    if not enabled:
        return lambda result: None
    from tqdm import tqdm

    bar = tqdm(total=load.requests, desc=f"{load.name:>18}", unit="req", leave=False, file=sys.stderr, disable=None)
    failed = [0]

    def update(result: RequestResult | None) -> None:
        if result is None:
            bar.close()
            return
        failed[0] += not result.ok
        bar.set_postfix(failed=failed[0], refresh=False)
        bar.update(1)

    return update


async def run_all(
    target: Target, specs: list[Load | tuple[str, int, int]], workload: Workload, sweep_streams: int
) -> list[LoadSummary]:
    summaries: list[LoadSummary] = []
    for spec in specs:
        loads = [spec] if isinstance(spec, Load) else None
        if loads is None:  # a sweep: bounds first, then the rates between
            _, k, n = spec
            low = await _run_one(target, Load("synchronous", n), workload)
            high = await _run_one(target, Load("concurrent", n, streams=sweep_streams), workload)
            summaries += [low, high]
            lo, hi = low.requests_per_s, high.requests_per_s
            loads = [Load("poisson", n, rate=lo + (hi - lo) * (i + 1) / (k + 1)) for i in range(k)]
        for load in loads:
            summaries.append(await _run_one(target, load, workload))
    return summaries


async def _run_one(target: Target, load: Load, workload: Workload) -> LoadSummary:
    results = await run_load(target, load, workload)
    summary = summarize(load.name, load.kind, load.streams, load.rate, [asdict(r) for r in results])
    print(f"  {load.name}: {summary.requests_ok} ok, {summary.requests_failed} failed", file=sys.stderr)
    return summary


# -- output ------------------------------------------------------------------------------
def write_results(out: Path, meta: dict[str, Any], summaries: list[LoadSummary], plot: bool = True) -> Path:
    """`<out>.json` (summaries and every request) and, unless plot is False, `<out>.png`."""
    out.parent.mkdir(parents=True, exist_ok=True)
    path = out.with_suffix(".json")
    path.write_text(json.dumps({"meta": meta, "loads": [s.to_dict() for s in summaries]}, indent=1))
    if plot:
        from scripts.bench.plot import plot_summaries

        plot_summaries(summaries, out.with_suffix(".png"), title=meta.get("title", ""))
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--model", default="llama")
    parser.add_argument("--api", choices=("native", "openai"), default="native")
    parser.add_argument("--key-file", type=Path, default=Path("key_file.json"))
    parser.add_argument("--tokenizer", type=Path, default=REPO / "models" / "tiny-llama")
    parser.add_argument("--load", dest="loads", type=parse_load, action="append", required=True)
    parser.add_argument("--sweep-streams", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--prompt-spread", type=int, default=10)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--output-spread", type=int, default=0)
    parser.add_argument("--no-ignore-eos", action="store_true", help="let requests stop at EOS (lengths vary)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "bench")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)

    tokenizer = args.tokenizer if args.tokenizer.is_dir() else None
    workload = Workload(
        PromptMaker(tokenizer, args.seed),
        Lengths(args.prompt_tokens, args.prompt_spread),
        Lengths(args.output_tokens, args.output_spread),
        args.seed,
        progress=not args.no_progress,
    )
    target = Target(args.url, args.model, args.api, auth_headers(args.key_file), ignore_eos=not args.no_ignore_eos)
    summaries = asyncio.run(run_all(target, args.loads, workload, args.sweep_streams))
    meta = {"url": args.url, "api": args.api, "argv": sys.argv[1:] if argv is None else argv}
    path = write_results(args.out, meta, summaries, plot=not args.no_plot)
    print(format_table(summaries))
    print(f"results: {path}")


if __name__ == "__main__":
    main()
