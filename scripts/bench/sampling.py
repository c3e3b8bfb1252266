"""Host sampling time per step, batched sampler vs the old per-slot one, against the device
step it follows (P8 of `make bench`).

Each case fills `rows` slots with the same sampling parameters and times one sampler call over
`[rows, vocab]` logits, best of `--repeats` (after a warm-up call). Two kinds of logits:
- stand-in: what the sim backend samples from (a language model's shape: a few dozen likely
  tokens over a flat background; backends/sim.py `stand_in_logits`); P8 reads these;
- flat: N(0, 1) over the whole vocabulary, the worst case for top-p (its 0.9 nucleus holds
  most of the vocabulary, so the batched sampler falls back to a full sort per row).

  P8 = host sampling time per step / the profile's decode step, every row top-p 0.9
       temperature 0.8 (goal <= 0.10; greedy goal <= 0.02), for
       (a) 8 rows x 32,000 (Llama-2-7B, profiles/llama-2-7b-inf2-48xl-tp24.yaml: step(8))
       (b) 32 rows x 128,256 (Llama-3.1-8B TP8 batch 32: ITL ~55 ms published, TGI neuron,
           guidellm throughput mode, shared/inf2-benchmarks.md): the step neuronx and nxdi
           (with host sampling) both sample on the host

Usage: python -m scripts.bench.sampling [--repeats 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]

from handler.backends.sim import stand_in_logits
from handler.backends.sim_profile import load_profile
from handler.request import SamplingParams, SlotRequest
from handler.sampling.sampler import BatchSampler
from scripts.bench.per_slot_sampler import PerSlotSampler

PROFILE_7B = REPO / "profiles" / "llama-2-7b-inf2-48xl-tp24.yaml"
# Llama-3.1-8B at TP8, batch 32: the step-time model's step (a published throughput-mode ITL holds
# the interleaved prefills too, so it is no step time: see the profile's header).
PROFILE_8B_TP8 = REPO / "profiles" / "llama-3.1-8b-inf2-48xl-tp8.yaml"
PARAMS = {
    "greedy": SamplingParams(),
    "top-p 0.9, T 0.8": SamplingParams(do_sample=True, temperature=0.8, top_p=0.9),
    "top-k 50 + top-p + rep. penalty": SamplingParams(
        do_sample=True, temperature=0.8, top_k=50, top_p=0.9, repetition_penalty=1.1
    ),
}
SAMPLERS: dict[str, Callable[..., object]] = {"batched": BatchSampler, "per-slot": PerSlotSampler}


@dataclass(frozen=True)
class Case:
    name: str  # "a" / "b"
    rows: int
    vocab: int
    step_ms: float
    step_source: str


@dataclass(frozen=True)
class Timing:
    case: str
    logits: str  # stand-in | flat
    params: str
    sampler: str
    ms: float  # best of the repeats
    ratio: float  # ms / the case's device step


def cases() -> list[Case]:
    profile, tp8 = load_profile(PROFILE_7B), load_profile(PROFILE_8B_TP8)
    return [
        Case("a", 8, profile.vocab_size, profile.decode_s(8) * 1000, f"{profile.name} step(8)"),
        Case("b", tp8.batch_size, tp8.vocab_size, tp8.decode_s(tp8.batch_size) * 1000, f"{tp8.name} step(32)"),
    ]


def time_sampler(sampler_cls, case: Case, params: SamplingParams, logits: torch.Tensor, repeats: int) -> float:
    sampler = sampler_cls(case.rows, {2}, 4096)
    prompt = tuple(range(100, 228))  # 128 prompt tokens: the repetition penalty's history
    for slot in range(case.rows):
        sampler.add(SlotRequest(slot, prompt, SamplingParams(**{**asdict(params), "seed": slot})))
    slots = list(range(case.rows))
    sampler.sample(slots, logits)  # warm-up: buffers, first-call paths
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        sampler.sample(slots, logits)
        best = min(best, time.perf_counter() - started)
    return best * 1000


def measure(repeats: int = 5, per_slot_repeats: int = 2, flat: bool = True) -> list[Timing]:
    """Every case x logits x params x sampler; the per-slot sampler (10-50x slower) with fewer repeats."""
    out = []
    for case in cases():
        kinds = {"stand-in": stand_in_logits(case.rows, case.vocab)}
        if flat:
            kinds["flat"] = torch.randn(case.rows, case.vocab, generator=torch.Generator().manual_seed(0))
        for kind, logits in kinds.items():
            for label, params in PARAMS.items():
                for name, cls in SAMPLERS.items():
                    n = repeats if name == "batched" else per_slot_repeats
                    ms = time_sampler(cls, case, params, logits, n)
                    out.append(Timing(case.name, kind, label, name, ms, ms / case.step_ms))
    return out


def find(timings: list[Timing], case: str, params: str, sampler: str, logits: str = "stand-in") -> Timing:
    return next(t for t in timings if (t.case, t.params, t.sampler, t.logits) == (case, params, sampler, logits))


def format_table(timings: list[Timing]) -> str:
    lines = ["case  rows x vocab     logits    params                            batched ms   per-slot ms  speed-up"]
    by_case = {c.name: c for c in cases()}
    for t in timings:
        if t.sampler != "batched":
            continue
        c = by_case[t.case]
        slow = find(timings, t.case, t.params, "per-slot", t.logits)
        lines.append(
            f"({t.case})   {c.rows:>2} x {c.vocab:<9,} {t.logits:<9} {t.params:<33} {t.ms:>8.2f}   "
            f"{slow.ms:>11.2f}  {slow.ms / t.ms:>7.1f}x"
        )
    lines.append(
        "device step: " + "; ".join(f"({c.name}) {c.step_ms:.1f} ms ({c.step_source})" for c in by_case.values())
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--per-slot-repeats", type=int, default=2)
    parser.add_argument("--no-flat", action="store_true", help="skip the flat (worst-case) logits")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    timings = measure(args.repeats, args.per_slot_repeats, flat=not args.no_flat)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; best of {args.repeats} (per-slot: "
        f"{args.per_slot_repeats})"
    )
    print(format_table(timings))
    for case in ("a", "b"):
        for params, goal in (("top-p 0.9, T 0.8", 0.10), ("greedy", 0.02)):
            t, slow = find(timings, case, params, "batched"), find(timings, case, params, "per-slot")
            print(
                f"P8{case}{'' if params != 'greedy' else '-greedy'} {t.ratio:.3f}  goal <= {goal:g} "
                f"{'met' if t.ratio <= goal else 'NOT met'}  ({params}; per-slot {slow.ratio:.3f})"
            )
    if args.json:
        args.json.write_text(json.dumps([asdict(t) for t in timings], indent=1))


if __name__ == "__main__":
    main()
