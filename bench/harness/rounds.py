"""Rounds, medians and ratios: one trial of each subject per round in a rotating order (the box is
shared and noisy), verdicts from the median of per-round ratios."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Iterable
from typing import Any

from bench.harness.load import Trial


def rate_text(per_s: float) -> str:
    return f"{per_s:,.0f} msg/s"


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.inf


def median(values: Iterable[float], empty: float = math.nan) -> float:
    """The median of the values that are numbers (a subject not run is NaN); `empty` if none."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else empty


def median_of(trials: list[Trial], key: Callable[[Trial], float]) -> float:
    return statistics.median(key(t) for t in trials) if trials else 0.0


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def run_rounds(
    title: str, subjects: dict[str, Callable[[int], Trial]], rounds: int
) -> dict[str, list[Trial]]:
    """One trial of each subject per round, the order rotated each round."""
    names = list(subjects)
    trials: dict[str, list[Trial]] = {name: [] for name in names}
    for r in range(rounds):
        shift = r % len(names)
        for name in names[shift:] + names[:shift]:
            trial = subjects[name](r)
            trials[name].append(trial)
            errors = f", errors {trial.errors}" if trial.errors else ""
            print(
                f"    {title} round {r + 1}: {name:<28} {rate_text(trial.rate):>14} "
                f"(server {trial.server_cores:.2f} cores, load {trial.client_cores:.2f}){errors}",
                flush=True,
            )
    return trials


def paired(trials: dict[str, list[Trial]], top: str, bottom: str) -> list[float]:
    return [
        round(ratio(a.rate, b.rate), 3) for a, b in zip(trials[top], trials[bottom], strict=True)
    ]


def series(trials: list[Trial]) -> dict[str, Any]:
    return {
        "median_per_s": round(median_of(trials, lambda t: t.rate), 1),
        "median_server_cores": round(median_of(trials, lambda t: t.server_cores), 2),
        "median_client_cores": round(median_of(trials, lambda t: t.client_cores), 2),
        "trials": [t.to_json() for t in trials],
    }


def cores_note(trials: list[Trial]) -> str:
    server = median_of(trials, lambda t: t.server_cores)
    client = median_of(trials, lambda t: t.client_cores)
    return f"server {server:.2f} + load {client:.2f} cores"


def check_clean(name: str, trials: list[Trial]) -> None:
    for trial in trials:
        if trial.errors:
            print(f"  warning: {name} had errors: {trial.errors}", file=sys.stderr)
