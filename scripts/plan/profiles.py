"""`make profiles`: the shipped sim profiles, written from the step-time model the planner uses
(handler/neuron/step_time.py calibrated on profiles/published-points.yaml, through
scripts/plan/sweep.py's step_profile), so that `make plan`, `make bench` and the sim agree by
construction. Each file's header is generated too: its sources, the model's ratio to every
published point it is checked against, and why a published figure that is not a step time
(the throughput-mode ITL) is not used. tests/unit/plan/test_generated_profiles.py regenerates
every file and compares.

Written: the Llama-3.1-8B TP8 profile (the seed table's layout). Kept as published figures (not
generated, each says why in its header): the two TP24 Llama-2 profiles (KEPT below).

    python -m scripts.plan.profiles            # write them, print the ratios
    python -m scripts.plan.profiles --check    # compare only; exit 1 where a file differs
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import yaml

from handler.backends.sim_profile import Generated, Profile
from handler.neuron.step_calibration import POINTS_FILE, Check, PublishedPoint, calibrate, check, load_points
from handler.neuron.step_time import Calibration, CoreWork, token_bucket
from scripts.plan.layouts import Workload
from scripts.plan.sweep import WIDEST_DRAFT, step_profile

REPO = Path(__file__).resolve().parents[2]
GENERATOR = "scripts/plan/profiles.py"


@dataclass(frozen=True)
class ThroughputITL:
    """A published throughput-mode ITL: not a step time (it holds the interleaved prefills)."""

    itl_ms: float
    users: int
    tokens_per_s: float
    source: str


@dataclass(frozen=True)
class Spec:
    """One generated profile: its layout, workload, compiled buckets and the points it is checked on."""

    file: str  # under the repository
    name: str
    model: str  # a key of published-points.yaml's `models`
    tp_degree: int
    n_slots: int
    n_positions: int
    buckets: tuple[int, ...]
    workload: Workload
    about: tuple[str, ...]  # the header's first lines: what is deployed
    buckets_why: str  # why these prompt buckets
    itl_points: tuple[str, ...]  # synchronous ITLs (decode points' ids)
    ttft_points: tuple[str, ...]  # serving-level synchronous TTFTs (prefill points' ids)
    throughput: ThroughputITL | None = None
    weight_dtype: str = "bf16"

    @property
    def path(self) -> Path:
        return REPO / self.file


SPECS = (
    Spec(
        file="profiles/llama-3.1-8b-inf2-48xl-tp8.yaml",
        name="llama-3.1-8b-inf2-48xl-tp8",
        model="llama-3.1-8b",
        tp_degree=8,
        n_slots=32,
        n_positions=4096,
        # configs/model-config-inf2-48xl-3x-tp8.yaml's context_length_estimate: 1500 +-150-token
        # prompts go to 1536 or 2048; 3072 = n_positions - max_new_tokens, the longest prompt served.
        buckets=(128, 256, 512, 1024, 1536, 2048, 3072),
        workload=Workload(1500, 250, 150),
        buckets_why="the compiled context_length_estimate of configs/model-config-inf2-48xl-3x-tp8.yaml: "
        "1500 +-150-token prompts go to 1536 (the shorter half) or 2048; 3072 = n_positions - 1024 new "
        "tokens, the longest prompt served; multiples of 8 (TP8).",
        about=(
            "Llama-3.1-8B(-Instruct) on inf2.48xlarge, one model copy on 8 of the 24 NeuronCores (TP8), bf16,",
            "compiled for batch 32 (continuous batching), n_positions 4096: one replica of the 3 x TP8 layout",
            "(configs/model-config-inf2-48xl-3x-tp8.yaml), for the seed workload (1500 +-150 prompt / 250",
            "output tokens). Read by handler/backends/sim_profile.py.",
        ),
        itl_points=("8b-tp8-bs32-vllm-2026", "8b-tp8-bs32-nxdi", "8b-tp8-bs32-vllm", "8b-tp8-bs32-tgi"),
        ttft_points=("8b-tp8-ttft1500-nxdi", "8b-tp8-ttft1500-tgi", "8b-tp8-ttft1500-vllm-2026"),
        throughput=ThroughputITL(
            59.1,
            32,
            426.0,
            "optimum-neuron benchmark/vllm/chunked-prefill/README.md, 1 replica, throughput (32 users): "
            "426 tok/s, TTFT 2.14 s, ITL 59.1 ms (shared/inf2-benchmarks.md, 2026 reruns)",
        ),
    ),
)

# Profiles of published figures, not generated: why (printed by main with the model's ratios).
KEPT = {
    "profiles/llama-2-7b-inf2-48xl-tp24.yaml": (
        ("7b-tp24-b1", "7b-tp24-b8", "7b-tp24-ttft128", "7b-tp24-b8-ttft128"),
        "its four figures are calibration points of the model, which gives them back exactly; it "
        "describes two compiled batches (1 and 8, the rows of a static batch), not one continuous batch",
    ),
    "profiles/llama-2-13b-inf2-48xl-tp24.yaml": (
        ("13b-tp24-b1", "13b-tp24-b8", "13b-tp24-ttft128", "13b-tp24-b8-ttft128", "13b-tp24-ttft4096"),
        "the model misses its 128-token TTFT by more than P10's band allows (13b-tp24-ttft128), and it "
        "describes two compiled batches (1 and 8, the rows of a static batch), not one continuous batch",
    ),
}


@dataclass(frozen=True)
class Generation:
    spec: Spec
    profile: Profile
    itl: list[Check]  # the published synchronous ITLs, with the model at their own conditions
    ttft: list[Check]
    date: str  # published-points.yaml's

    def step_ms(self) -> float:
        return self.profile.decode_s(self.spec.n_slots) * 1000

    def prefill_ms(self, bucket: int) -> float:
        return self.profile.prefill_s(1, bucket) * 1000

    def verify_ms(self) -> float:
        """The widest verify step the profile carries: every slot with WIDEST_DRAFT drafted tokens."""
        return self.profile.verify_s(self.spec.n_slots, WIDEST_DRAFT) * 1000


def calibration(points_file: Path = POINTS_FILE) -> tuple[Calibration, list[PublishedPoint], str]:
    """The planner's calibration, its points and their date."""
    points = load_points(points_file)
    date = str(yaml.safe_load(points_file.read_text()).get("date", ""))
    return calibrate(points), points, date


def generate(spec: Spec, points_file: Path = POINTS_FILE) -> Generation:
    """The spec's profile from the model, and the published points it is checked against."""
    cal, points, date = calibration(points_file)
    by_id = {p.id: p for p in points}
    shape = next(p.shape for p in points if p.model == spec.model)
    work = CoreWork.of(shape, spec.tp_degree, spec.weight_dtype)
    modelled = step_profile(
        spec.name, work, cal, spec.n_slots, spec.n_positions, spec.workload, shape.vocab, spec.buckets
    )
    generated = Generated(
        by=GENERATOR,
        model=spec.model,
        tp_degree=spec.tp_degree,
        weight_dtype=spec.weight_dtype,
        prompt_tokens=spec.workload.prompt_tokens,
        prompt_spread=spec.workload.prompt_spread,
        output_tokens=spec.workload.output_tokens,
        calibration_date=date,
    )
    source = (
        f"handler/neuron/step_time.py calibrated on profiles/published-points.yaml (dated {date}), through "
        f"scripts/plan/sweep.py's step_profile (the planner's); written by `make profiles` ({GENERATOR})"
    )
    profile = Profile.model_validate({**modelled.model_dump(), "source": source, "generated": generated})
    itl = check([by_id[i] for i in spec.itl_points], cal)
    ttft = check([by_id[i] for i in spec.ttft_points], cal)
    return Generation(spec, profile, itl, ttft, date)


# -- the file ----------------------------------------------------------------------------
def render(g: Generation) -> str:
    """The YAML file: the generated header, then the profile."""
    body = g.profile.model_dump(exclude_none=True)
    body["context_buckets"] = list(body["context_buckets"])
    return (
        "\n".join(f"# {line}".rstrip() for line in header(g))
        + "\n"
        + yaml.safe_dump(body, sort_keys=False, width=100, default_flow_style=None)
    )


def header(g: Generation) -> list[str]:
    s, w = g.spec, g.spec.workload
    kv = token_bucket(w.longest_prompt + w.output_tokens, s.n_positions)
    buckets = ", ".join(f"{b}: {g.prefill_ms(b):.1f}" for b in s.buckets)
    lines = [
        f"GENERATED by `make profiles` ({GENERATOR}): edit that script or profiles/published-points.yaml",
        "and regenerate, not this file (tests/unit/plan/test_generated_profiles.py regenerates and compares).",
        "",
        *s.about,
        "",
        f"Times: handler/neuron/step_time.py calibrated on profiles/published-points.yaml (dated {g.date}),",
        "through scripts/plan/sweep.py's step_profile: what `make plan` models for this layout.",
        f"  decode: {g.step_ms():.2f} ms whatever the live rows: the graph compiled for batch {s.n_slots} computes",
        f"    every slot (static shapes), at the token bucket of the longest row ({w.longest_prompt} + "
        f"{w.output_tokens} -> {kv} positions).",
        "    The sim's host sampler runs on top of it (about 4 ms for 32 x 128,256, docs/inferentia2.md).",
        *_wrap(
            f"verify: {g.verify_ms():.2f} ms for a speculative step of every slot with {WIDEST_DRAFT} drafted tokens "
            f"each ({(WIDEST_DRAFT + 1) * s.n_slots} tokens, scripts/plan/sweep.py's verify_ms: weights and each row's "
            "cache read once, the per-row overhead per token); the sim interpolates it for a smaller k "
            "(handler.sim.speculation_acceptance, docs/speculative.md). A model: no published verify step.",
            "  ",
        ),
        *_wrap(
            f"prefill: one row at each compiled bucket (ms: {buckets}); and {s.n_slots} rows x {s.buckets[-1]} "
            "for prefills of several rows at once (scripts/bench/des.py's ideal policy; the sim prefills one "
            "row at a time).",
            "  ",
        ),
        *_wrap(f"Buckets: {s.buckets_why}", "  "),
        *checked_against(g),
    ]
    if s.throughput:
        lines += not_a_step(g, s.throughput)
    return lines


def checked_against(g: Generation) -> list[str]:
    lines = [
        "Checked against the published points (profiles/published-points.yaml, their sources there):",
        f"  synchronous ITLs (one live request: the {g.spec.n_slots}-row step plus a small per-token path);",
        "  this profile's step / published (goal within P10's band), and the model at the run's own bucket:",
    ]
    for c in g.itl:
        lines.append(
            f"    {c.point.id:<22} {c.point.published_ms:>6.2f} ms  {g.step_ms() / c.point.published_ms:.2f}"
            f"  (model {c.predicted_ms:.2f} ms, {c.ratio:.2f})  {c.point.note}"
        )
    lines.append("  serving-level synchronous TTFTs (client-side: the server's own path included, so above the")
    lines.append("  device prefill); this profile's prefill of one row at the point's bucket / published:")
    for c in g.ttft:
        ratio = g.prefill_ms(c.point.prompt_bucket) / c.point.published_ms
        lines.append(
            f"    {c.point.id:<26} {c.point.published_ms:>6.1f} ms  {ratio:.2f}  (bucket {c.point.prompt_bucket})"
            f"  {c.point.note}"
        )
    return lines


def prefill_every(spec: Spec) -> float:
    """Decode steps per prefill with every slot busy: n_slots requests of output_tokens each."""
    return spec.workload.output_tokens / spec.n_slots


def not_a_step(g: Generation, t: ThroughputITL) -> list[str]:
    every, prompt = prefill_every(g.spec), g.spec.workload.prompt_tokens
    ttft = g.profile.prefill_s(1, prompt) * 1000
    mixed = (every * g.step_ms() + ttft) / every
    text = (
        f"Not a step time: the throughput-mode ITL, {t.itl_ms:g} ms at {t.users} users ({t.source}). It "
        f"contains the prompts' prefills interleaved between decode steps: {g.spec.n_slots} slots x "
        f"{g.spec.workload.output_tokens} tokens is one prefill every ~{every:.0f} steps, (8 x 25 + 300) / 8 ~ 62 ms "
        f"with the published step and TTFT, ({every:.1f} x {g.step_ms():.1f} + {ttft:.0f}) / {every:.1f} = "
        f"{mixed:.1f} ms with this profile's (a {prompt}-token prompt's bucket). The sim charges every prefill "
        "itself, so taking it as the step would count the prefills twice."
    )
    return _wrap(text)


def _wrap(text: str, indent: str = "") -> list[str]:
    """Header prose at 100 columns (after the comment's '# '), continued lines indented."""
    return textwrap.wrap(text, 98, initial_indent=indent, subsequent_indent=indent + "  ")


# -- the command -------------------------------------------------------------------------
def kept_ratios(points_file: Path = POINTS_FILE) -> list[str]:
    """The model's ratio to each figure of the profiles kept as published, and why they are kept."""
    cal, points, _ = calibration(points_file)
    by_id = {p.id: p for p in points}
    lines = []
    for file, (ids, why) in KEPT.items():
        ratios = ", ".join(f"{c.point.id} {c.ratio:.2f}" for c in check([by_id[i] for i in ids], cal))
        lines.append(f"kept {file}: model / published {ratios}; not generated: {why}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the files; write nothing")
    parser.add_argument("--points-file", type=Path, default=POINTS_FILE)
    args = parser.parse_args(argv)
    stale = []
    for spec in SPECS:
        g = generate(spec, args.points_file)
        text = render(g)
        print("\n".join(checked_against(g)))
        current = spec.path.read_text() if spec.path.exists() else ""
        if args.check:
            stale += [spec.file] if current != text else []
            print(f"{spec.file}: {'differs' if current != text else 'up to date'}")
        else:
            spec.path.write_text(text)
            print(f"wrote {spec.file}: decode {g.step_ms():.2f} ms, prefill {dict(g.profile.prefill_ms)}")
    print("\n".join(kept_ratios(args.points_file)))
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
