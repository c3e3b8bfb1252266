"""`make bench-lora`: many LoRA adapters on one base model (issue 43), P15 and the per-step cost.

    P15 = served output tok/s, 8 streams, clients on 4 different adapters mixed (client i on adapter i % 4)
          / the same load with every client on the base model                               (goal >= 0.8)

The default model (SmolLM2-135M-Instruct, f32) on the hf backend, in one run:
  1. four seeded, non-zero PEFT adapters (tests/support/lora.py, rank 8 on q_proj and v_proj unless
     `--rank` / `--targets`) written under the workdir;
  2. in-process, no server: the backend loaded as the worker loads it (load_backend, which installs
     handler.lora), 8 slots prefilled, then `--steps` decode steps timed with 8 base rows and with 4
     adapters x 2 rows; and the same 8 base rows on a second backend loaded without handler.lora (the
     bare model, no LoRA layer), for scale; the three alternate, `--step-rounds` runs each (median ms/step);
  3. ONE TorchServe with the default model config (copied; n_slots 8, batchSize 16, jobQueueSize 32,
     handler.lora: the 4 adapters, max_loras 4, cpu_threads 1 unless `--cpu-threads 0`): 8 concurrent
     closed-loop clients, each sending `--requests-per-client` streamed OpenAI completions of `--prompt-tokens`
     prompt tokens and exactly `--output-tokens` output tokens (`ignore_eos`, greedy), first all on the
     base model, then `--repeats` (2) times on the adapters and on the base again, alternating;
     served tok/s = output tokens / the load's wall time. P15 is the adapter loads' mean over the base
     loads' mean; every base figure is printed, so their spread shows the noise. Beside each load the
     worker's own mean decode and prefill step (llm_decode_step_seconds, llm_prefill_step_seconds).
Prints a table and the ratios; writes bench_results/bench-lora.json.

    python -m scripts.bench.lora --model-dir models/smollm2-135m-instruct --workdir build/bench-lora

A measurement, not a test: one run's figures on a shared host.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[2]

from handler.backends.base import Backend
from handler.backends.loader import load_backend
from handler.config import ServingConfig
from handler.request import SlotRequest
from scripts.bench import server as bench_server
from scripts.bench.client import PromptMaker, RequestResult, Target, send
from scripts.bench.frontend_admission import summed
from scripts.bench.stats import LoadSummary, format_table, summarize
from tests.support.lora import TARGET_MODULES, make_lora_adapter

MODEL_NAME = "llama"  # the served base model's name (bench_server's default)
STREAMS = 8
ADAPTERS = 4
GOAL = 0.8
NOISY = 0.10  # base loads further apart than this (of their mean): the host was busy, P15 is not to be trusted
STEP_METRICS = ("llm_decode_step_seconds", "llm_prefill_step_seconds")


# -- the adapters and the model config -----------------------------------------------------------
def adapter_names(count: int = ADAPTERS) -> list[str]:
    return [f"adapter-{i}" for i in range(count)]


def make_adapters(model_dir: Path, root: Path, rank: int, targets: list[str]) -> dict[str, Path]:
    """The four adapters, seeds 1..4, made afresh under `root`."""
    shutil.rmtree(root, ignore_errors=True)
    return {
        name: make_lora_adapter(model_dir, root / name, seed, rank=rank, target_modules=targets)
        for seed, name in enumerate(adapter_names(), start=1)
    }


def model_config(base: dict[str, Any], adapters: dict[str, Path], rank: int, cpu_threads: int) -> dict[str, Any]:
    """The default config with 8 slots (batchSize 2 x, jobQueueSize 4 x, as docs/configuration.md
    advises), the hf backend and the adapters, by absolute path."""
    config = copy.deepcopy(base)
    config["batchSize"] = 2 * STREAMS
    config["jobQueueSize"] = 4 * STREAMS
    config["maxBatchDelay"] = 1
    config["continuousBatching"] = True
    config.setdefault("scheduler", {}).update({"mode": "continuous", "n_slots": STREAMS})
    handler = config.setdefault("handler", {})
    handler["backend"] = "hf"
    if cpu_threads:
        handler["cpu_threads"] = cpu_threads
    handler["lora"] = {
        "adapters": {name: str(path) for name, path in adapters.items()},
        "max_loras": ADAPTERS,
        "max_lora_rank": max(16, rank),
    }
    return config


def prompts(maker: PromptMaker, count: int, tokens: int) -> list[tuple[int, ...]]:
    """`count` prompts of `tokens` token ids each, windows of the corpus at random offsets."""
    ids = maker.ids
    return [tuple(ids[(maker.rng.randrange(len(ids)) + j) % len(ids)] for j in range(tokens)) for _ in range(count)]


# -- 2. in-process step cost ---------------------------------------------------------------------
def timed_steps(backend: Backend, rows: list[SlotRequest], steps: int, warm: int = 2) -> list[float]:
    """Prefill `rows` into their slots, `warm` untimed decode steps, then `steps` timed ones (s); released."""
    slots = [row.slot for row in rows]
    backend.prefill(rows)
    try:
        for _ in range(warm):
            backend.decode(slots)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            backend.decode(slots)
            times.append(time.perf_counter() - t0)
    finally:
        for slot in slots:
            backend.release(slot)
    return times


def step_cost(
    config: dict[str, Any], model_dir: Path, ids: list[tuple[int, ...]], steps: int, rounds: int
) -> dict[str, Any]:
    """Median decode step (ms) of 8 rows: base rows and 4 adapters x 2 rows on the backend with the adapters,
    and base rows on a second backend loaded without them (the bare model), the three alternating, `rounds`
    runs each, so a neighbour's load moves all three alike."""
    config = copy.deepcopy(config)
    config["handler"]["model_checkpoint_dir"] = str(model_dir)
    bare_config = copy.deepcopy(config)
    del bare_config["handler"]["lora"]
    with_lora = load_backend(ServingConfig.from_model_yaml(config), model_dir)
    bare = load_backend(ServingConfig.from_model_yaml(bare_config), model_dir)
    names = adapter_names()
    cases: dict[str, tuple[Backend, list[str | None]]] = {
        "base": (with_lora, [None] * STREAMS),
        "adapters": (with_lora, [names[slot % ADAPTERS] for slot in range(STREAMS)]),
        "bare": (bare, [None] * STREAMS),
    }

    def rows(adapters: list[str | None]) -> list[SlotRequest]:
        return [
            SlotRequest(slot=slot, prompt_ids=ids[slot], ignore_eos=True, adapter_id=adapter)
            for slot, adapter in enumerate(adapters)
        ]

    times: dict[str, list[float]] = {case: [] for case in cases}
    try:
        for backend, adapters in cases.values():  # warm each backend and every adapter's layers
            timed_steps(backend, rows(adapters), 2)
        for _ in range(rounds):
            for case, (backend, adapters) in cases.items():
                times[case] += timed_steps(backend, rows(adapters), steps)
    finally:
        with_lora.close()
        bare.close()
    out: dict[str, Any] = {
        case: {"step_ms_p50": statistics.median(t) * 1000, "step_ms_mean": statistics.mean(t) * 1000, "steps": len(t)}
        for case, t in times.items()
    }
    out["ratio_adapters_to_base"] = out["adapters"]["step_ms_p50"] / out["base"]["step_ms_p50"]
    out["ratio_base_to_bare"] = out["base"]["step_ms_p50"] / out["bare"]["step_ms_p50"]
    out["ratio_adapters_to_bare"] = out["adapters"]["step_ms_p50"] / out["bare"]["step_ms_p50"]
    return out


# -- 3. the served loads -------------------------------------------------------------------------
@dataclass(frozen=True)
class AdapterTarget(Target):
    """The OpenAI completions route of the served model; `adapter` goes in the body's `model`."""

    adapter: str | None = None

    def body(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        body = super().body(prompt, max_tokens)
        return (body | {"model": self.adapter}) if self.adapter else body


@dataclass
class ServedLoad:
    name: str
    adapters: list[str | None]  # per client
    summary: LoadSummary
    short: int  # requests that ended with fewer than the asked-for tokens
    step_ms: dict[str, float]  # the worker's mean step time during the load, per metric

    @property
    def tokens_per_s(self) -> float:
        return self.summary.output_tokens_per_s

    def to_dict(self) -> dict[str, Any]:
        summary = {k: v for k, v in self.summary.to_dict().items() if k != "requests"}
        return {"name": self.name, "adapters": self.adapters, "short": self.short, "step_ms": self.step_ms} | {
            "summary": summary
        }


def step_totals(server: Any) -> dict[str, tuple[float, float]]:
    """(sum, count) of the worker's step histograms; {} when the metrics cannot be read."""
    try:
        text = server.scrape_metrics()
    except (httpx.HTTPError, OSError) as exc:
        print(f"[lora] could not scrape metrics: {exc}", file=sys.stderr)
        return {}
    return {name: (summed(text, f"{name}_sum"), summed(text, f"{name}_count")) for name in STEP_METRICS}


def step_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float]:
    out = {}
    for name in set(before) & set(after):
        total, count = after[name][0] - before[name][0], after[name][1] - before[name][1]
        if count > 0:
            out[name.removeprefix("llm_").removesuffix("_seconds") + "_ms"] = 1000 * total / count
    return out


async def drive(
    server: Any, adapters: list[str | None], texts: list[list[str]], output_tokens: int
) -> list[RequestResult]:
    """One closed-loop client per entry of `adapters`, each sending its `texts` in turn."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=2 * len(adapters))
    results: list[RequestResult] = []
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(600.0, connect=30.0)) as http:

        async def client(adapter: str | None, own: list[str]) -> None:
            target = AdapterTarget(
                server.url, MODEL_NAME, "openai", server.headers, sampling={"temperature": 0}, adapter=adapter
            )
            for prompt in own:
                results.append(await send(http, target, prompt, output_tokens, time.perf_counter()))

        await asyncio.gather(*(client(adapter, own) for adapter, own in zip(adapters, texts, strict=True)))
    return results


def run_load(
    server: Any, name: str, adapters: list[str | None], texts: list[list[str]], output_tokens: int
) -> ServedLoad:
    before = step_totals(server)
    results = asyncio.run(drive(server, adapters, texts, output_tokens))
    after = step_totals(server)
    summary = summarize(name, "concurrent", len(adapters), 0.0, [asdict(r) for r in results])
    short = sum(r.ok and r.completion_tokens != output_tokens for r in results)
    load = ServedLoad(name, adapters, summary, short, step_means(before, after))
    steps = ", ".join(f"{k} {v:.1f}" for k, v in sorted(load.step_ms.items()))
    print(
        f"  {name}: {load.tokens_per_s:.1f} tok/s, {summary.requests_ok} ok, {summary.requests_failed} failed, "
        f"{short} short; worker {steps}",
        flush=True,
    )
    for error in summary.errors:
        print(f"    error: {error}"[:300], flush=True)
    return load


def serve_and_measure(
    workdir: Path, model_dir: Path, config: dict[str, Any], texts: list[list[str]], args: argparse.Namespace
) -> list[ServedLoad]:
    base: list[str | None] = [None] * STREAMS
    mixed: list[str | None] = [adapter_names()[i % ADAPTERS] for i in range(STREAMS)]
    print(f"starting torchserve in {workdir} ...", flush=True)
    server = bench_server.start(workdir, model_dir, config, model_name=MODEL_NAME, timeout=300)
    loads = []
    try:
        warm = [own[:1] for own in texts]
        asyncio.run(drive(server, mixed, warm, 8))  # warm-up: every adapter, connections, the worker
        asyncio.run(drive(server, base, warm, 8))
        loads.append(run_load(server, "base 1", base, texts, args.output_tokens))
        for n in range(1, args.repeats + 1):
            loads.append(run_load(server, f"adapters {n}", mixed, texts, args.output_tokens))
            loads.append(run_load(server, f"base {n + 1}", base, texts, args.output_tokens))
    finally:
        server.stop()
    return loads


# -- report --------------------------------------------------------------------------------------
def p15(loads: list[ServedLoad]) -> dict[str, Any]:
    base = [load.tokens_per_s for load in loads if load.name.startswith("base")]
    mixed = [load.tokens_per_s for load in loads if load.name.startswith("adapters")]
    base_mean, mixed_mean = statistics.mean(base), statistics.mean(mixed)
    steps = {
        kind: [load.step_ms["decode_step_ms"] for load in loads if load.name.startswith(kind) and load.step_ms]
        for kind in ("base", "adapters")
    }
    step_ratio = statistics.mean(steps["adapters"]) / statistics.mean(steps["base"]) if all(steps.values()) else None
    return {
        "served_decode_step_ratio": step_ratio,  # the worker's mean decode step, adapter loads / base loads
        "P15": mixed_mean / base_mean,
        "adapters_tokens_per_s": mixed,
        "base_tokens_per_s": base,
        "adapters_mean": mixed_mean,
        "base_mean": base_mean,
        "base_spread": (max(base) - min(base)) / base_mean,  # the noise between the base loads
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "smollm2-135m-instruct")
    parser.add_argument("--model-config", type=Path, default=REPO / "model-config.yaml", help="copied, then changed")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench-lora")
    parser.add_argument("--out", type=Path, default=REPO / "bench_results" / "bench-lora.json")
    parser.add_argument("--rank", type=int, default=8, help="each adapter's rank (r)")
    parser.add_argument("--targets", default=",".join(TARGET_MODULES), help="modules each adapter targets")
    parser.add_argument("--cpu-threads", type=int, default=1, help="handler.cpu_threads (0: the config's)")
    parser.add_argument("--requests-per-client", type=int, default=2, help="per client, each load (8 clients)")
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=64, help="every request's, EOS ignored")
    parser.add_argument("--repeats", type=int, default=2, help="adapter / base load pairs after the first base load")
    parser.add_argument("--step-rounds", type=int, default=3, help="in-process: timed runs of each case")
    parser.add_argument("--steps", type=int, default=12, help="in-process: timed decode steps per run")
    parser.add_argument("--no-steps", action="store_true", help="skip the in-process step cost")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.rank, args.requests_per_client, args.prompt_tokens, args.repeats, args.step_rounds, args.steps) < 1:
        parser.error("counts, ranks and token numbers must be at least 1")
    if args.output_tokens < 2:
        parser.error("--output-tokens must be at least 2")
    args.targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    args.model_dir, args.workdir = args.model_dir.resolve(), args.workdir.resolve()
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started, load_at_start = time.perf_counter(), os.getloadavg()
    print(f"[lora] {ADAPTERS} adapters, rank {args.rank} on {','.join(args.targets)} ...", flush=True)
    adapters = make_adapters(args.model_dir, args.workdir / "adapters", args.rank, args.targets)
    config = model_config(yaml.safe_load(args.model_config.read_text()), adapters, args.rank, args.cpu_threads)
    maker = PromptMaker(args.model_dir, args.seed)
    ids = prompts(maker, STREAMS * args.requests_per_client, args.prompt_tokens)

    steps = None
    if not args.no_steps:
        print(f"[lora] in-process decode steps, {STREAMS} rows, {args.prompt_tokens}-token prompts ...", flush=True)
        steps = step_cost(config, args.model_dir, ids[:STREAMS], args.steps, args.step_rounds)

    decoded = [maker.tokenizer.decode(list(p)) for p in ids]  # the same prompts, as text
    texts = [decoded[c * args.requests_per_client : (c + 1) * args.requests_per_client] for c in range(STREAMS)]
    loads = serve_and_measure(args.workdir / "server", args.model_dir, config, texts, args)
    result = p15(loads)

    print()
    print(format_table([load.summary for load in loads]))
    if steps is not None:
        print(
            f"step (in-process, {STREAMS} rows, median): base rows {steps['base']['step_ms_p50']:.1f} ms, "
            f"{ADAPTERS} adapters x {STREAMS // ADAPTERS} rows {steps['adapters']['step_ms_p50']:.1f} ms "
            f"(x{steps['ratio_adapters_to_base']:.2f}), bare model {steps['bare']['step_ms_p50']:.1f} ms "
            f"(base rows with adapters loaded x{steps['ratio_base_to_bare']:.2f})"
        )
    served_steps = {load.name: load.step_ms.get("decode_step_ms") for load in loads}
    print(
        "served decode step (worker, mean ms): "
        + ", ".join(f"{k} {v:.1f}" for k, v in served_steps.items() if v)
        + (f" (adapters / base x{r:.2f})" if (r := result["served_decode_step_ratio"]) else "")
    )
    base_text = " / ".join(f"{v:.1f}" for v in result["base_tokens_per_s"])
    mixed_text = " / ".join(f"{v:.1f}" for v in result["adapters_tokens_per_s"])
    print(
        f"P15 {result['P15']:.2f} (goal >= {GOAL}) {'met' if result['P15'] >= GOAL else 'NOT met'} = adapters "
        f"{mixed_text} tok/s / base {base_text} tok/s (mean {result['base_mean']:.1f}, spread "
        f"{100 * result['base_spread']:.0f} %); {STREAMS} streams, {ADAPTERS} adapters, "
        f"{args.output_tokens} tokens each"
    )
    if result["base_spread"] > NOISY:
        print(
            f"WARNING: the base loads differ by {100 * result['base_spread']:.0f} % (1-min load average "
            f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs): other work shared the cores; rerun when quiet"
        )
    if any(load.summary.requests_failed or load.short for load in loads):
        print("WARNING: failed or short requests: the figures are not comparable")

    elapsed = time.perf_counter() - started
    model_dir = args.model_dir
    out = {
        "model": str(model_dir.relative_to(REPO)) if model_dir.is_relative_to(REPO) else str(model_dir),
        "model_config": str(args.model_config),
        "argv": sys.argv[1:] if argv is None else argv,
        "settings": {
            "streams": STREAMS,
            "adapters": ADAPTERS,
            "rank": args.rank,
            "target_modules": args.targets,
            "n_slots": STREAMS,
            "max_loras": ADAPTERS,
            "cpu_threads": config["handler"].get("cpu_threads"),
            "requests_per_client": args.requests_per_client,
            "prompt_tokens": args.prompt_tokens,
            "output_tokens": args.output_tokens,
            "repeats": args.repeats,
            "temperature": 0,
        },
        "cpus": os.cpu_count(),
        "loadavg_at_start": load_at_start,  # 1, 5, 15 min: other jobs on the same cores move every figure
        "loadavg_at_end": os.getloadavg(),
        "elapsed_s": elapsed,
        "P15": result,
        "goal": {"P15": [">=", GOAL]},
        "step_cost_in_process": steps,
        "loads": [load.to_dict() for load in loads],
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1))
    print(
        f"load average (1 min) {load_at_start[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; "
        f"{os.cpu_count()} CPUs"
    )
    print(f"{args.out} written ({elapsed:.0f} s)")


if __name__ == "__main__":
    main()
