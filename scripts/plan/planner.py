"""Capacity planner (`make plan`): which instance, tp_degree, replicas and slots serve this
checkpoint within a latency budget, at the lowest cost per output token. Offline, from the
checkpoint's config.json alone.

1. The step-time model (handler/neuron/step_time.py) is calibrated on published step times and
   checked on the ones it was not calibrated on: the validation table and P10 come first.
2. Every layout: each instance of profiles/inf2-instances.yaml (or --instance), every tp_degree
   the instance's NeuronCores allow, replicas = cores // tp_degree, n_slots of --slots, and
   n_positions for the workload (the prompt bucket + the output, rounded up to 512).
3. Layouts that cannot load are dropped with the limit they hit (handler/neuron/memory.py: HBM
   per core; host RAM to shard the checkpoint at load).
4. The others run the discrete-event simulation of the continuous scheduler (scripts/bench/des.py,
   through scripts/plan/sweep.py) on Poisson loads with the modelled step times, up to the highest
   rate keeping TTFT p90 <= --slo-ttft-ms and ITL p50 <= --slo-itl-ms.
5. Ranked by cost per million output tokens (the instance's on-demand price); the reason each
   loser lost; a PNG of throughput against ITL for the top layouts; the winner's model-config.yaml.
6. With --speculation-k K (and --acceptance-rate A): the top layouts swept again with speculative
   decoding modelled (scripts/plan/sweep.py: a verify step of (K + 1) x slots tokens giving each row
   (1 - A^(K+1)) / (1 - A) tokens), printed and written apart, marked a model, not a measurement.

    python -m scripts.plan.planner --model /models/Llama-3.1-8B-Instruct --instance inf2.48xlarge
    python -m scripts.plan.planner --model tests/fixtures/configs/llama-2-7b.json --slo-itl-ms 30
    python -m scripts.plan.planner --model ... --speculation-k 3 --acceptance-rate 0.6
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from handler.backends.sim_profile import Profile
from handler.config import SimConfig
from handler.errors import ConfigError
from handler.neuron.memory import ModelShape, estimate
from handler.neuron.step_calibration import POINTS_FILE, Check, as_dict, calibrated, format_validation
from handler.neuron.step_time import Calibration, CoreWork
from scripts.bench.des import DEFAULT_BUDGET
from scripts.plan.layouts import (
    INSTANCES_FILE,
    SLOT_CHOICES,
    Candidate,
    Workload,
    candidates,
    fit_problem_of,
    load_instances,
    most_positions,
)
from scripts.plan.report import (
    Outcome,
    SpeculativeOutcome,
    config_snippet,
    format_losers,
    format_ranking,
    format_speculation,
    plot,
    rank,
    speculation_report,
)
from scripts.plan.sweep import (
    REQUESTS_PER_LOAD,
    SLO,
    WIDEST_DRAFT,
    BudgetTrial,
    Speculation,
    Sweep,
    choose_budget,
    format_budgets,
    speculative_profile,
    step_profile,
    sweep,
)

REPO = Path(__file__).resolve().parents[2]
SPECULATIVE_LAYOUTS = 5  # the top layouts that fit, swept again with speculation
DEFAULT_ACCEPTANCE = SimConfig.model_fields["speculation_acceptance"].default  # the sim's


def evaluate(
    shape: ModelShape,
    found: list[Candidate],
    cal: Calibration,
    workload: Workload,
    slo: SLO,
    requests: int,
    presharded: bool = False,
    budget: int = DEFAULT_BUDGET,
) -> list[Outcome]:
    """Each candidate's fit, steps and sweep. Layouts with the same tp_degree, slots and replicas
    behave alike on any instance: each is simulated once. `presharded`: fit_problem_of's."""
    swept: dict[tuple[int, int, int], tuple[float, float, Sweep | None, str | None]] = {}
    outcomes = []
    for c in found:
        outcome = Outcome(c, no_fit=fit_problem_of(shape, c, presharded))
        if outcome.no_fit is None:
            key = (c.tp_degree, c.n_slots, c.replicas)
            if key not in swept:
                swept[key] = _sweep_one(shape, c, cal, workload, slo, requests, budget)
            outcome.decode_ms, outcome.prefill_ms, outcome.sweep, outcome.miss = swept[key]
            outcome.most_positions = most_positions(shape, c)
            outcome.near_hbm_limit = estimate(shape, c.layout).near_limit
        outcomes.append(outcome)
    return outcomes


def profile_of(shape: ModelShape, c: Candidate, cal: Calibration, workload: Workload) -> Profile:
    """The layout's modelled step times, as the sim would run them."""
    work = CoreWork.of(shape, c.tp_degree, c.weight_dtype, sdk=c.sdk)
    return step_profile(
        f"plan {shape.name} TP{c.tp_degree} x {c.n_slots}", work, cal, c.n_slots, c.n_positions, workload, shape.vocab
    )


def evaluate_speculation(
    shape: ModelShape,
    ranked: list[Outcome],
    cal: Calibration,
    workload: Workload,
    slo: SLO,
    requests: int,
    speculation: Speculation,
    budget: int = DEFAULT_BUDGET,
    layouts: int = SPECULATIVE_LAYOUTS,
) -> list[SpeculativeOutcome]:
    """The first `layouts` ranked layouts that fit, swept again at the speculative pace (a model)."""
    out = []
    for plain in [o for o in ranked if o.no_fit is None][:layouts]:
        c = plain.candidate
        profile = profile_of(shape, c, cal, workload)
        fast = speculative_profile(profile, speculation)
        modelled = Outcome(c, most_positions=plain.most_positions, near_hbm_limit=plain.near_hbm_limit)
        modelled.decode_ms, modelled.prefill_ms, modelled.sweep, modelled.miss = _sweep_profile(
            fast, c, workload, slo, requests, budget, "the speculative pace per token"
        )
        out.append(SpeculativeOutcome(plain, modelled, speculation.verify_ms(profile)))
    return out


def _sweep_one(
    shape: ModelShape, c: Candidate, cal: Calibration, workload: Workload, slo: SLO, requests: int, budget: int
) -> tuple[float, float, Sweep | None, str | None]:
    return _sweep_profile(profile_of(shape, c, cal, workload), c, workload, slo, requests, budget)


def _sweep_profile(
    profile: Profile,
    c: Candidate,
    workload: Workload,
    slo: SLO,
    requests: int,
    budget: int,
    step: str = "a decode step",
) -> tuple[float, float, Sweep | None, str | None]:
    step_ms = profile.decode_s(c.n_slots) * 1000
    prefill_ms = profile.prefill_s(1, workload.prompt_tokens) * 1000
    if step_ms > slo.itl_p50_ms:
        return (
            step_ms,
            prefill_ms,
            None,
            f"{step} of {c.n_slots} slot(s) is {step_ms:.1f} ms > ITL {slo.itl_p50_ms:g}",
        )
    if prefill_ms > slo.ttft_p90_ms:
        return step_ms, prefill_ms, None, f"one prefill is {prefill_ms:.0f} ms > TTFT {slo.ttft_p90_ms:g}"
    result = sweep(profile, c.replicas, workload, slo, budget=budget, requests=requests)
    miss = None if result.best else f"at {result.points[0].rate:.2g} req/s already {result.first_miss}"
    return step_ms, prefill_ms, result, miss


def parse_price(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    try:
        price = float(value)
    except ValueError:
        price = math.nan
    if not math.isfinite(price) or price <= 0:
        raise argparse.ArgumentTypeError(f"--price {text!r}: use INSTANCE=USD_PER_HOUR, e.g. inf2.48xlarge=9.5")
    return name.strip(), price


def at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= low."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {low}")
        return value

    return parse


def parse_rate(text: str) -> float:
    """An argparse type: a probability, 0 to 1."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a probability within [0, 1], e.g. 0.6")
    return value


def parse_draft(text: str) -> int:
    """An argparse type: scheduler.speculation's k, 1 to 8."""
    value = at_least(1)(text)
    if value > WIDEST_DRAFT:
        raise argparse.ArgumentTypeError(f"{text!r}: k is at most {WIDEST_DRAFT} (scheduler.speculation)")
    return value


def parse_slots(text: str) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--slots {text!r}: use e.g. 1,2,4,8,16,32,64")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a checkpoint directory or its config.json")
    parser.add_argument("--instance", action="append", help="only this instance (repeatable); default: all")
    parser.add_argument("--slo-itl-ms", type=float, default=50.0, help="ITL p50 budget (ms)")
    parser.add_argument("--slo-ttft-ms", type=float, default=1000.0, help="TTFT p90 budget (ms)")
    parser.add_argument("--prompt-tokens", type=at_least(1), default=1500)
    parser.add_argument("--prompt-spread", type=at_least(0), default=0, help="standard deviation of the prompt length")
    parser.add_argument("--output-tokens", type=at_least(2), default=250, help="at least 2: an ITL needs two tokens")
    parser.add_argument("--slots", type=parse_slots, default=SLOT_CHOICES, help="n_slots to try, e.g. 8,16,32")
    parser.add_argument("--weight-dtype", choices=("bf16", "int8"), default="bf16")
    parser.add_argument("--backend", choices=("neuronx", "nxdi"), default="neuronx", help="for the snippet")
    parser.add_argument("--price", type=parse_price, action="append", default=[], help="INSTANCE=USD_PER_HOUR")
    parser.add_argument("--requests", type=at_least(1), default=REQUESTS_PER_LOAD, help="per replica and load")
    parser.add_argument(
        "--prefill-token-budget",
        type=at_least(1),
        default=None,
        help="scheduler.prefill_token_budget for every layout; default: every layout at "
        f"{DEFAULT_BUDGET}, then the winner's chosen among 1, 2, 4 and 8 of the longest prompt",
    )
    parser.add_argument("--top", type=at_least(1), default=10, help="rows of the ranking")
    parser.add_argument(
        "--speculation-k",
        type=parse_draft,
        default=None,
        help="also model speculative decoding with k drafted tokens per row and step (1-8) for the top "
        f"{SPECULATIVE_LAYOUTS} layouts: a model, not a measurement",
    )
    parser.add_argument(
        "--acceptance-rate",
        type=parse_rate,
        default=None,
        help="with --speculation-k: the probability that each drafted token is accepted; default "
        f"{DEFAULT_ACCEPTANCE:g}, the sim's handler.sim.speculation_acceptance",
    )
    parser.add_argument("--out", type=Path, default=REPO / "build" / "plan", help="the PNG and JSON go here")
    parser.add_argument("--instances-file", type=Path, default=INSTANCES_FILE)
    parser.add_argument("--points-file", type=Path, default=POINTS_FILE)
    args = parser.parse_args(argv)
    if args.weight_dtype == "int8" and args.backend != "neuronx":
        parser.error("--weight-dtype int8 is planned for the neuronx backend (quantize_weights: s8)")
    if args.acceptance_rate is not None and args.speculation_k is None:
        parser.error("--acceptance-rate needs --speculation-k (the drafted tokens per row and step)")
    speculation = None
    if args.speculation_k is not None:
        rate = DEFAULT_ACCEPTANCE if args.acceptance_rate is None else args.acceptance_rate
        speculation = Speculation(args.speculation_k, rate)
    started = time.perf_counter()

    cal, checks = calibrated(args.points_file)
    print(format_validation(checks, cal))
    print()

    try:
        shape = ModelShape.from_path(args.model)
        workload = Workload(args.prompt_tokens, args.output_tokens, args.prompt_spread)
        n_positions = workload.n_positions(shape)
    except (ConfigError, ValueError) as exc:
        print(f"plan: {exc}", file=sys.stderr)
        return 2
    prices = load_instances(args.instances_file, dict(args.price))
    unknown = sorted(set(args.instance or ()) - set(prices.instances))
    if unknown:
        print(f"plan: unknown instance {', '.join(unknown)}; known: {', '.join(prices.instances)}", file=sys.stderr)
        return 2
    instances = [i for name, i in prices.instances.items() if not args.instance or name in args.instance]
    slo = SLO(args.slo_ttft_ms, args.slo_itl_ms)
    found = candidates(shape, instances, workload, args.slots, args.weight_dtype, args.backend)
    print(
        f"Plan for {shape.name} ({_count(shape.parameters())} parameters, {args.weight_dtype}): "
        f"{workload.prompt_tokens}"
        + (f" +- {workload.prompt_spread}" if workload.prompt_spread else "")
        + f"-token prompts, {workload.output_tokens} output tokens (n_positions {n_positions}, prompt buckets "
        f"{workload.buckets()}); SLO TTFT p90 <= {slo.ttft_p90_ms:g} ms, ITL p50 <= {slo.itl_p50_ms:g} ms; "
        f"{len(found)} layouts on {', '.join(i.name for i in instances)} "
        f"(on-demand {prices.region}, prices of {prices.date})"
    )
    presharded = args.backend == "nxdi"  # save_sharded_checkpoint: true, the nxdi backend's default
    budget = args.prefill_token_budget or DEFAULT_BUDGET
    outcomes = rank(evaluate(shape, found, cal, workload, slo, args.requests, presharded, budget))
    modelled: list[SpeculativeOutcome] = []
    if speculation is not None:  # at the ranking's budget, so that the two compare
        modelled = evaluate_speculation(shape, outcomes, cal, workload, slo, args.requests, speculation, budget)
    print(format_ranking(outcomes, slo, args.top))
    losers = format_losers(outcomes)
    if losers:
        print(losers)

    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"plan-{shape.name}"
    png = plot(outcomes, slo, args.out / f"{stem}.png", f"{shape.name}: throughput vs ITL p50 (modelled)")
    if png:
        print(f"\nPlot: {png}")
    winner = next((o for o in outcomes if o.best is not None), None)
    trials: list[BudgetTrial] = []
    if winner and args.prefill_token_budget is None:
        chosen, trials = choose_budget(
            profile_of(shape, winner.candidate, cal, workload), winner.candidate.replicas, workload, slo, args.requests
        )
        print("\n" + format_budgets(chosen, trials))
        if chosen is not None:
            budget = chosen.budget
    figures = report(outcomes, checks, workload, slo) | {"prefill_token_budget": _budgets(budget, trials)}
    if speculation is not None:
        print("\n" + format_speculation(modelled, speculation, slo))
        figures["speculation"] = speculation_report(modelled, speculation)
    (args.out / f"{stem}.json").write_text(json.dumps(figures, indent=1))
    if winner:
        more = ""
        if winner.most_positions > winner.candidate.n_positions:
            more = f" (up to n_positions {winner.most_positions} also fits these slots)"
        print(f"\nWinner: {winner.candidate.label()}{more}. model-config.yaml:\n")
        print(config_snippet(winner, workload, shape.name, args.backend, budget))
    else:
        print("\nNo winner: loosen the SLO, shorten the workload, or try --weight-dtype int8.")
    sweeps = {id(o.sweep): o.sweep for o in outcomes if o.sweep}
    sweeps |= {id(m.modelled.sweep): m.modelled.sweep for m in modelled if m.modelled.sweep}
    sims = sum(len(s.points) for s in sweeps.values())
    print(f"({time.perf_counter() - started:.1f} s: {len(sweeps)} layouts swept, {sims} simulated loads)")
    return 0 if winner else 1


def _budgets(chosen: int, trials: list[BudgetTrial]) -> dict[str, Any]:
    """The budget in the snippet, and each one tried for the winner."""
    tried = []
    for t in trials:
        b = t.best
        tried.append(
            {"budget": t.budget, "prompts": t.prompts}
            | ({"req_per_s": round(b.rate, 4), "ttft_p90_ms": round(b.summary.ttft_ms.p90, 1)} if b else {})
            | ({"itl_p50_ms": round(b.summary.itl_ms.p50, 2)} if b else {})
        )
    return {"chosen": chosen, "tried": tried}


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e8 else f"{n / 1e6:.2f}M"


def report(outcomes: list[Outcome], checks: list[Check], workload: Workload, slo: SLO) -> dict[str, Any]:
    """What build/plan/plan-<model>.json holds: the validation, then every layout's figures."""
    rows = []
    for o in outcomes:
        c = o.candidate
        row = {
            "instance": c.instance.name,
            "tp_degree": c.tp_degree,
            "replicas": c.replicas,
            "n_slots": c.n_slots,
            "n_positions": c.n_positions,
            "no_fit": o.no_fit,
            "miss": o.miss,
            "decode_ms": round(o.decode_ms, 3),
            "prefill_ms": round(o.prefill_ms, 3),
        }
        if o.best:
            row |= {
                "req_per_s": round(o.best.rate, 4),
                "tokens_per_s": round(o.best.tokens_per_s, 1),
                "ttft_p90_ms": round(o.best.summary.ttft_ms.p90, 1),
                "itl_p50_ms": round(o.best.summary.itl_ms.p50, 2),
                "usd_per_million_tokens": round(o.usd_per_million, 4),
            }
        rows.append(row)
    return {
        "workload": vars(workload),
        "slo": vars(slo),
        "validation": as_dict(checks),
        "layouts": rows,
    }


if __name__ == "__main__":
    sys.exit(main())
