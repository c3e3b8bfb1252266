"""Discrete-event reference for P3: what a scheduling policy alone does to TTFT, with the
profile's step times and no serving overhead at all.

- `static`: TorchServe's frontend batching + one micro-batch at a time (today's handler):
  a free worker takes the queued requests, waits up to `max_batch_delay` for `batch_size`
  of them, prefills them together and decodes until the batch's longest request ends; new
  arrivals wait for the whole micro-batch.
- `slots`: an ideal slot scheduler (continuous batching): before each decode step, waiting
  requests are prefilled into free slots; a finished request frees its slot at once.

Fixed output length, prompts in one context bucket, Poisson arrivals. Used by
`make bench` to tell policy from overhead: if the served P3 is close to the `static`
figure, the handler adds little and the policy is what costs.

    python scripts/bench_des.py --profile profiles/llama-2-7b-inf2-48xl-tp24.yaml
"""

from __future__ import annotations

import argparse
import random
import sys
from collections import deque
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from handler.backends.sim_profile import Profile, load_profile


@dataclass(frozen=True)
class Workload:
    rate: float  # req/s
    requests: int
    prompt_tokens: int
    output_tokens: int
    seed: int = 0

    def arrivals(self) -> list[float]:
        rng, t, out = random.Random(self.seed), 0.0, []
        for _ in range(self.requests):
            t += rng.expovariate(self.rate)
            out.append(t)
        return out


def static_ttfts(profile: Profile, w: Workload, max_batch_delay: float) -> list[float]:
    arrivals = w.arrivals()
    b, free_at, i, ttfts = profile.batch_size, 0.0, 0, []
    while i < len(arrivals):
        start = max(free_at, arrivals[i])  # the worker polls and takes the first request
        end = min(i + b, len(arrivals))
        full_at = arrivals[end - 1] if end - i == b else float("inf")
        close = max(start, min(start + max_batch_delay, full_at))  # full, or the delay is up
        rows = [a for a in arrivals[i : i + b] if a <= close]
        prefill = profile.prefill_s(len(rows), w.prompt_tokens)
        ttfts += [close + prefill - a for a in rows]
        free_at = close + prefill + (w.output_tokens - 1) * profile.decode_s(len(rows))
        i += len(rows)
    return ttfts


def slot_ttfts(profile: Profile, w: Workload) -> list[float]:
    arrivals = deque(w.arrivals())
    b, now, ttfts = profile.batch_size, 0.0, []
    live: list[int] = []  # tokens still to generate, per occupied slot
    waiting: deque[float] = deque()
    while arrivals or waiting or live:
        while arrivals and arrivals[0] <= now:
            waiting.append(arrivals.popleft())
        if not live and not waiting:
            now = arrivals[0]
            continue
        joining = [waiting.popleft() for _ in range(min(b - len(live), len(waiting)))]
        if joining:
            now += profile.prefill_s(len(joining), w.prompt_tokens)
            ttfts += [now - a for a in joining]
            live += [w.output_tokens - 1] * len(joining)
        if live:
            now += profile.decode_s(len(live))
            live = [n - 1 for n in live if n > 1]
    return ttfts


def median(values: list[float]) -> float:
    s = sorted(values)
    return (s[(len(s) - 1) // 2] + s[len(s) // 2]) / 2


def p3(profile: Profile, fraction: float, prompt_tokens: int, output_tokens: int, max_batch_delay: float) -> dict:
    """TTFT p50 at `fraction` of capacity over idle TTFT p50, for both policies."""
    capacity = profile.ideal_tokens_per_s() / output_tokens
    loaded = Workload(fraction * capacity, 5000, prompt_tokens, output_tokens)
    idle = Workload(capacity / 1000, 200, prompt_tokens, output_tokens)
    out = {"rate_req_per_s": loaded.rate}
    for name, run in (
        ("static", lambda w: static_ttfts(profile, w, max_batch_delay)),
        ("slots", lambda w: slot_ttfts(profile, w)),
    ):
        idle_ms, loaded_ms = median(run(idle)) * 1000, median(run(loaded)) * 1000
        out[name] = {"idle_ttft_ms": idle_ms, "loaded_ttft_ms": loaded_ms, "P3": loaded_ms / idle_ms}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", type=Path, required=True)
    parser.add_argument("--load-fraction", type=float, default=0.7)
    parser.add_argument("--prompt-tokens", type=int, default=100)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--max-batch-delay-ms", type=float, default=20)
    args = parser.parse_args()
    result = p3(
        load_profile(args.profile),
        args.load_fraction,
        args.prompt_tokens,
        args.output_tokens,
        args.max_batch_delay_ms / 1000,
    )
    for name in ("static", "slots"):
        r = result[name]
        print(f"{name:>6}: idle TTFT {r['idle_ttft_ms']:.1f} ms, loaded {r['loaded_ttft_ms']:.1f} ms, P3 {r['P3']:.2f}")


if __name__ == "__main__":
    main()
