"""The step-time model's calibration and validation on published step times.

profiles/published-points.yaml lists published Inferentia2 decode and prefill times, each with
its conditions and source, and a role: `calibrate` points fix the model's free constants
(handler/neuron/step_time.py, least squares: five decode points for five unknowns and four
prefill points for four, so they come back exactly), `validate` points are held out and
predicted.

P10 is the held-out check: predicted / published time for every held-out point; the goal is
every ratio within [0.8, 1.25]. It is a measurement of the model, printed by `make plan`, not
a test that passes or fails. Two kinds of held-out point are printed with their ratio but
left out of P10, each saying why in the points file: one `superseded_by` a newer published
measurement of the same configuration, and a `serving_level` TTFT (a client-side time to first
token that includes the server's own path, not the device prefill the model predicts).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from handler.neuron.memory import ModelShape
from handler.neuron.step_time import (
    Calibration,
    CoreWork,
    decode_features,
    decode_ms,
    fit,
    mean_kv_positions,
    prefill_features,
    prefill_ms,
)

POINTS_FILE = Path(__file__).resolve().parent.parent.parent / "profiles" / "published-points.yaml"
P10_BAND = (0.8, 1.25)
Kind = Literal["decode", "prefill"]


@dataclass(frozen=True)
class PublishedPoint:
    id: str
    kind: Kind
    role: Literal["calibrate", "validate"]
    source: str
    model: str
    shape: ModelShape
    tp_degree: int
    batch: int
    published_ms: float
    weight_dtype: str = "bf16"
    prompt_tokens: int = 0  # decode
    output_tokens: int = 0  # decode
    n_positions: int = 0  # decode
    prompt_bucket: int = 0  # prefill
    note: str = ""
    superseded_by: str = ""  # the id of a newer measurement of the same configuration
    serving_level: bool = False  # a client-side TTFT: the server's own path included

    @property
    def in_p10(self) -> bool:
        return self.role == "validate" and not self.superseded_by and not self.serving_level

    def excluded_because(self) -> str:
        if self.superseded_by:
            return f"superseded by {self.superseded_by}"
        return "serving-level" if self.serving_level else ""

    def work(self) -> CoreWork:
        return CoreWork.of(self.shape, self.tp_degree, self.weight_dtype)

    def features(self) -> tuple[float, ...]:
        if self.kind == "decode":
            return decode_features(self.work(), self.batch, self.kv_positions())
        return prefill_features(self.work(), self.batch, self.prompt_bucket)

    def kv_positions(self) -> float:
        """A decode point's token bucket, averaged over its generation."""
        return mean_kv_positions(self.prompt_tokens, self.output_tokens, self.n_positions)

    def conditions(self) -> str:
        dtype = "" if self.weight_dtype == "bf16" else f" {self.weight_dtype}"
        if self.kind == "decode":
            return f"TP{self.tp_degree}{dtype} b{self.batch} {self.prompt_tokens}+{self.output_tokens}"
        return f"TP{self.tp_degree}{dtype} b{self.batch} x {self.prompt_bucket} tok"


def load_points(path: Path = POINTS_FILE) -> list[PublishedPoint]:
    raw = yaml.safe_load(path.read_text())
    shapes = {name: ModelShape.from_config(config, name) for name, config in raw["models"].items()}
    points = []
    for entry in raw["points"]:
        entry = dict(entry)
        try:
            shape = shapes[entry["model"]]
        except KeyError:
            raise ValueError(f"{path}: point {entry.get('id')}: unknown model {entry.get('model')!r}") from None
        points.append(PublishedPoint(shape=shape, **entry))
    ids = {p.id for p in points}
    for p in points:
        if p.superseded_by and (p.superseded_by not in ids or p.role == "calibrate"):
            problem = "unknown" if p.superseded_by not in ids else "on a calibration point"
            raise ValueError(f"{path}: point {p.id}: superseded_by {p.superseded_by!r}: {problem}")
    return points


def calibrate(points: Sequence[PublishedPoint]) -> Calibration:
    """The constants that reproduce the `calibrate` points (least squares per kind)."""
    inverse_bw, inverse_kv_bw, per_layer, per_row, int8_upcast = _fit_kind(points, "decode")
    overhead, inverse_prefill_bw, inverse_compute, inverse_attention = _fit_kind(points, "prefill")
    return Calibration(
        bandwidth_efficiency=1 / inverse_bw,
        kv_bandwidth_efficiency=1 / inverse_kv_bw,
        layer_overhead_ms=per_layer,
        row_overhead_ms=per_row,
        int8_upcast=int8_upcast,
        prefill_overhead_ms=overhead,
        prefill_bandwidth_efficiency=1 / inverse_prefill_bw,
        compute_efficiency=1 / inverse_compute,
        attention_efficiency=1 / inverse_attention,
    )


def _fit_kind(points: Sequence[PublishedPoint], kind: Kind) -> tuple[float, ...]:
    chosen = [p for p in points if p.kind == kind and p.role == "calibrate"]
    return fit([p.features() for p in chosen], [p.published_ms for p in chosen])


@dataclass(frozen=True)
class Check:
    point: PublishedPoint
    predicted_ms: float

    @property
    def ratio(self) -> float:
        return self.predicted_ms / self.point.published_ms

    @property
    def in_band(self) -> bool:
        return P10_BAND[0] <= self.ratio <= P10_BAND[1]


def predict(point: PublishedPoint, cal: Calibration) -> float:
    """Through the functions the planner calls, so P10 validates what it plans with."""
    if point.kind == "decode":
        return decode_ms(point.work(), point.batch, point.kv_positions(), cal)
    return prefill_ms(point.work(), point.batch, point.prompt_bucket, cal)


def check(points: Sequence[PublishedPoint], cal: Calibration) -> list[Check]:
    return [Check(p, predict(p, cal)) for p in points]


@dataclass(frozen=True)
class P10:
    """The held-out ratios of one kind: the lowest, the highest, and how many are in the band."""

    kind: str
    low: Check
    high: Check
    in_band: int
    total: int

    @property
    def met(self) -> bool:
        return self.in_band == self.total

    def line(self) -> str:
        verdict = "met" if self.met else "NOT met"
        return (
            f"P10 {self.kind:<7} {self.low.ratio:.2f} .. {self.high.ratio:.2f}  ({self.in_band} of {self.total} "
            f"held-out points within [{P10_BAND[0]}, {P10_BAND[1]}]: goal {verdict}; lowest {self.low.point.id}, "
            f"highest {self.high.point.id})"
        )


def p10(checks: Sequence[Check], kind: Kind) -> P10 | None:
    """Over the held-out points of `kind` that count (not superseded, not serving-level)."""
    held = [c for c in checks if c.point.kind == kind and c.point.in_p10]
    if not held:
        return None
    ordered = sorted(held, key=lambda c: c.ratio)
    return P10(kind, ordered[0], ordered[-1], sum(c.in_band for c in held), len(held))


def format_validation(checks: Sequence[Check], cal: Calibration) -> str:
    """The table `make plan` prints first: every point, its ratio, and P10 per kind."""
    lines = [
        "Step-time model (handler/neuron/step_time.py) on published Inferentia2 times (profiles/published-points.yaml)",
        f"  fitted: {cal.describe()}",
        f"  {'point':<26} {'role':<9} {'kind':<7} {'conditions':<24} {'source':<11} {'published':>9} "
        f"{'model':>8} {'ratio':>6}",
    ]
    order = {"calibrate": 0, "validate": 1}
    for c in sorted(checks, key=lambda c: (order[c.point.role], not c.point.in_p10, c.point.kind, c.point.id)):
        p = c.point
        role = "calib" if p.role == "calibrate" else "held-out" if p.in_p10 else "not-P10"
        if p.role == "calibrate":
            flag = ""
        elif not p.in_p10:
            flag = f"  ({p.excluded_because()})"
        else:
            flag = "" if c.in_band else "  <- outside"
        lines.append(
            f"  {p.id:<26} {role:<9} {p.kind:<7} {p.conditions():<24} {p.source:<11} {p.published_ms:>9.2f} "
            f"{c.predicted_ms:>8.2f} {c.ratio:>6.2f}{flag}"
        )
    calibrated = [c for c in checks if c.point.role == "calibrate"]
    worst = max((abs(c.ratio - 1) for c in calibrated), default=0.0)
    lines.append(f"  the {len(calibrated)} calibration points come back within {worst:.1e} of their published times")
    for kind in ("decode", "prefill"):
        found = p10(checks, kind)
        if found:
            lines.append("  " + found.line())
    for reason, outside in (
        ("superseded", [c for c in checks if c.point.superseded_by]),
        ("serving-level", [c for c in checks if c.point.serving_level and not c.point.superseded_by]),
    ):
        if outside:
            ratios = sorted(c.ratio for c in outside)
            lines.append(
                f"  not in P10, {reason}: {len(outside)} point(s), ratios {ratios[0]:.2f} .. {ratios[-1]:.2f} "
                "(profiles/published-points.yaml says why)"
            )
    return "\n".join(lines)


def calibrated(path: Path = POINTS_FILE) -> tuple[Calibration, list[Check]]:
    points = load_points(path)
    cal = calibrate(points)
    return cal, check(points, cal)


def as_dict(checks: Sequence[Check]) -> list[Mapping[str, Any]]:
    return [
        {
            "id": c.point.id,
            "kind": c.point.kind,
            "role": c.point.role,
            "in_p10": c.point.in_p10,
            "excluded_because": c.point.excluded_because(),
            "source": c.point.source,
            "published_ms": c.point.published_ms,
            "predicted_ms": round(c.predicted_ms, 3),
            "ratio": round(c.ratio, 3),
        }
        for c in checks
    ]
