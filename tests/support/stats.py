"""Figures of a run: the steady-state median, the first time a series stays at a level."""

from __future__ import annotations

import statistics

def steady_median(values: list[float], skip: int) -> float:
    """Median after dropping the first ``skip`` values (warm-up); nan if nothing is left."""
    rest = list(values[skip:])
    return statistics.median(rest) if rest else float("nan")


def first_time_at_or_above(series: list[tuple[float, float]], level: float, hold: int = 3) -> float | None:
    """First t of ``[(t, v)]`` from which ``hold`` consecutive values are all >= level."""
    for i in range(len(series) - hold + 1):
        if all(v >= level for _, v in series[i:i + hold]):
            return series[i][0]
    return None

