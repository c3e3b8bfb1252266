"""`make bench`: reference, server, loads, ratios, all in one run.

sim (default): the bare-backend reference is the profile; the server runs the `sim`
backend with the profile; loads are synchronous, concurrent at the compiled batch size,
and Poisson at `--load-fraction` of capacity, where capacity (req/s) is the ideal
`batch_size / step(batch_size)` tokens/s divided by the mean output length. Ratios:
  P1 = served ITL p50, one stream / profile step at batch 1              (goal <= 1.05)
  P2 = served output tok/s, batch_size streams / ideal tok/s             (goal >= 0.90)
  P3 = TTFT p50 at 70% of capacity / TTFT p50 idle (synchronous)         (goal <= 1.5)
hf: a small random Llama (a few million parameters) measured in-process with `generate`
(best of three, before and after the served loads), then served; synchronous and
concurrent-at-batch-size loads. Ratio:
  P5 = served output tok/s / in-process generate tok/s at the same batch size (goal >= 0.90)
Each ratio is printed last, on its own line: `P2 0.93`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_server
from bench import Lengths, Load, PromptMaker, Target, Workload, run_all, write_results
from bench_backend import reference
from bench_des import p3 as des_p3
from bench_stats import LoadSummary, format_table

from handler.backends.sim_profile import load_profile  # scripts above put the repository on sys.path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_PROFILE = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
HF_BATCH = 4
METRIC_NAMES = ("llm_time_to_first_token_seconds", "llm_inter_token_latency_seconds", "llm_queue_wait_seconds")


def sim_model_config(profile: Path, time_scale: float) -> dict[str, Any]:
    config = yaml.safe_load((REPO / "configs" / "model-config-sim.yaml").read_text())
    config["handler"]["sim"]["profile"] = str(profile.resolve())
    config["handler"]["sim"]["time_scale"] = time_scale
    return config


def hf_model_config(batch: int) -> dict[str, Any]:
    return {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": batch,
        "maxBatchDelay": 20,
        "responseTimeout": 120,
        "handler": {
            "model_checkpoint_dir": "model",
            "backend": "hf",
            "cpu_threads": 1,  # one core for the model, one for the frontend, engine and client; same in-process
            "n_positions": 1024,
            "default_max_new_tokens": 64,
            "max_new_tokens": 512,
        },
        "micro_batching": {
            "micro_batch_size": batch,
            "parallelism": {"preprocess": 2, "inference": 1, "postprocess": 2},
        },
    }


def small_model(workdir: Path) -> Path:
    """A random Llama of about 2.6M parameters: a decode step takes milliseconds on CPU."""
    out = workdir / "small-llama"
    if not (out / "config.json").exists():
        subprocess.run(
            [sys.executable, str(REPO / "scripts/make_tiny_model.py"), str(out)]
            + ["--hidden-size", "256", "--layers", "4", "--heads", "8"],
            check=True,
        )
    return out


def compute_ratios(backend: str, ref: dict[str, Any], by_kind: dict[str, LoadSummary]) -> dict[str, float]:
    sync, conc, rated = by_kind.get("synchronous"), by_kind.get("concurrent"), by_kind.get("poisson")
    ratios: dict[str, float] = {}
    if backend == "sim":
        if sync:
            ratios["P1"] = sync.itl_ms.p50 / ref["step_1_ms"]
        if conc:
            ratios["P2"] = conc.output_tokens_per_s / ref["ideal_tokens_per_s"]
        if sync and rated:
            ratios["P3"] = rated.ttft_ms.p50 / sync.ttft_ms.p50
    elif conc:
        ratios["P5"] = conc.output_tokens_per_s / ref["generate_tokens_per_s"]
    return ratios


def handler_metrics(text: str) -> dict[str, float]:
    """Mean of each of our histograms from a Prometheus scrape (sum / count)."""
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        for name in METRIC_NAMES:
            if line.startswith(name + "_sum"):
                sums[name] = sums.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
            elif line.startswith(name + "_count"):
                counts[name] = counts.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return {name: sums[name] / counts[name] for name in sums if counts.get(name)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sim", "hf"), default="sim")
    parser.add_argument("--profile", type=Path, default=DEFAULT_PROFILE)
    parser.add_argument("--model-dir", type=Path, default=REPO / "models" / "tiny-llama", help="sim: tokenizer")
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "bench")
    parser.add_argument("--out", type=Path, help="result file stem (default bench_results/bench-<backend>)")
    parser.add_argument("--sync-requests", type=int, default=20)
    parser.add_argument("--concurrent-rounds", type=int, default=10, help="requests per stream")
    parser.add_argument("--poisson-requests", type=int, default=300)
    parser.add_argument("--load-fraction", type=float, default=0.7)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--prompt-spread", type=int, default=10)
    parser.add_argument("--output-tokens", type=int, help="default: 128 (sim), 64 (hf)")
    parser.add_argument("--time-scale", type=float, default=1.0, help="sim: scales every simulated sleep")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args()

    started = time.monotonic()
    workdir = args.workdir.resolve() / args.backend
    output_tokens = args.output_tokens or (128 if args.backend == "sim" else 64)
    if args.backend == "sim":
        model_dir, config = args.model_dir.resolve(), sim_model_config(args.profile, args.time_scale)
    else:
        model_dir, config = small_model(workdir), hf_model_config(HF_BATCH)

    print(f"[bench] bare-backend reference ({args.backend}) ...", file=sys.stderr)
    ref_config = config | {"handler": {**config["handler"], "model_checkpoint_dir": str(model_dir)}}
    repeats = 1 if args.backend == "sim" else 3
    ref = reference(ref_config, model_dir, args.prompt_tokens, output_tokens, repeats)
    batch = ref["batch_size"]
    loads = [Load("synchronous", args.sync_requests), Load("concurrent", batch * args.concurrent_rounds, batch)]
    capacity = ref["ideal_tokens_per_s"] / output_tokens
    if args.backend == "sim" and args.poisson_requests > 0:
        loads.append(Load("poisson", args.poisson_requests, rate=args.load_fraction * capacity))

    print(f"[bench] starting torchserve in {workdir} ...", file=sys.stderr)
    server = bench_server.start(workdir, model_dir, config)
    try:
        target = Target(server.url, server.model_name, "native", server.headers)
        workload = Workload(
            PromptMaker(model_dir, seed=0),
            Lengths(args.prompt_tokens, args.prompt_spread),
            Lengths(output_tokens, 0),
            seed=0,
            progress=not args.no_progress,
        )
        summaries = asyncio.run(run_all(target, list(loads), workload, sweep_streams=batch))
        try:
            metrics = handler_metrics(server.scrape_metrics())
        except Exception as exc:  # the figures stand without the cross-check
            print(f"[bench] could not scrape metrics: {exc}", file=sys.stderr)
            metrics = {}
    finally:
        server.stop()

    if args.backend != "sim":  # the machine may have been busier before: measure again, keep the faster
        print("[bench] bare-backend reference again ...", file=sys.stderr)
        again = reference(ref_config, model_dir, args.prompt_tokens, output_tokens, repeats)
        ref["generate_tokens_per_s_runs"] = [ref["generate_tokens_per_s"], again["generate_tokens_per_s"]]
        if again["generate_tokens_per_s"] > ref["generate_tokens_per_s"]:
            ref = again | {"generate_tokens_per_s_runs": ref["generate_tokens_per_s_runs"]}
    by_kind = {s.kind: s for s in summaries}
    ratios = compute_ratios(args.backend, ref, by_kind)
    policy = None
    if args.backend == "sim":  # what the scheduling policy alone costs, with no serving overhead
        delay_s = config["maxBatchDelay"] / 1000
        policy = des_p3(load_profile(args.profile), args.load_fraction, args.prompt_tokens, output_tokens, delay_s)
    meta = {
        "title": f"{args.backend}: {ref.get('profile', {}).get('name', 'small hf model')} (batch {batch})",
        "backend": args.backend,
        "reference": ref,
        "capacity_req_per_s": capacity,
        "output_tokens": output_tokens,
        "ratios": ratios,
        "handler_metrics_mean_s": metrics,
        "policy_reference_des": policy,
        "wall_s": time.monotonic() - started,
    }
    out = args.out or REPO / "bench_results" / f"bench-{args.backend}"
    path = write_results(out, meta, summaries)
    print()
    print(
        f"reference: step(1) {ref['step_1_ms']:.2f} ms, step({batch}) {ref['step_batch_ms']:.2f} ms, "
        f"ideal {ref['ideal_tokens_per_s']:.0f} tok/s, in-process generate at batch {batch} "
        f"{ref['generate_tokens_per_s']:.0f} tok/s; capacity {capacity:.2f} req/s at {output_tokens} output tokens"
    )
    print(format_table(summaries))
    if policy:
        s, q = policy["static"], policy["slots"]
        print(
            f"policy reference (discrete-event, profile times, no serving overhead) at {policy['rate_req_per_s']:.2f} "
            f"req/s: static micro-batching TTFT p50 {s['loaded_ttft_ms']:.0f} ms / idle {s['idle_ttft_ms']:.1f} ms = "
            f"P3 {s['P3']:.2f}; ideal slot scheduler {q['loaded_ttft_ms']:.1f} / {q['idle_ttft_ms']:.1f} ms = "
            f"P3 {q['P3']:.2f}"
        )
    if metrics:
        print("handler metrics (mean): " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in metrics.items()))
    print(f"results: {path} and {path.with_suffix('.png')} ({time.monotonic() - started:.0f} s)")
    print(json.dumps({"ratios": {k: round(v, 3) for k, v in ratios.items()}}), file=sys.stderr)
    for name, value in ratios.items():
        print(f"{name} {value:.2f}")


if __name__ == "__main__":
    main()
