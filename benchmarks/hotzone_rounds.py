"""bench_hotzone's interleaved rounds (``--rounds K --order ABBA``).

On a shared, noisy machine the load drifts over minutes; scenarios run once,
one after another, fold that drift into their ratios. ``--rounds K`` runs the
scenario list K times; order ``ABBA`` reverses it on every other round
(A B, B A, A B, ...), so over each pair of rounds a drift that is linear in
time falls on every scenario alike; ``ABAB`` keeps the same order every round.
The summary gives each scenario's steady median IOPS per round, their median
and their spread (min–max), and the ratios of those medians.
"""

from __future__ import annotations

import math
import statistics

from benchmarks.hotzone_report import DAEMONS, LABELS, Result, events_lost, t90

ORDERS = ("ABBA", "ABAB")


def round_orders(names: list[str], rounds: int, order: str = "ABBA") -> list[list[str]]:
    """The scenario list of each round: reversed on every other round for ``ABBA``."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, not {order!r}")
    return [list(reversed(names)) if order == "ABBA" and k % 2 else list(names)
            for k in range(rounds)]


def _median(values: list[float]) -> float:
    values = [v for v in values if not math.isnan(v)]
    return statistics.median(values) if values else float("nan")


def rounds_figures(rounds: list[dict[str, Result]], steady_from: float) -> dict:
    """Per scenario: its steady median IOPS in each round, their median, min and max."""
    names = list(dict.fromkeys(n for r in rounds for n in r))
    per = {n: [r[n].steady_median(steady_from) if n in r else float("nan") for r in rounds]
           for n in names}
    ok = {n: [v for v in vs if not math.isnan(v)] for n, vs in per.items()}
    return {"per_round": per, "median": {n: _median(vs) for n, vs in per.items()},
            "min": {n: min(vs) if vs else float("nan") for n, vs in ok.items()},
            "max": {n: max(vs) if vs else float("nan") for n, vs in ok.items()}}


def rounds_summary(rounds: list[dict[str, Result]], orders: list[list[str]], order: str,
                   steady_from: float) -> tuple[str, dict]:
    """Markdown: the rounds' order, a table of each scenario across rounds, the ratios of medians."""
    fig = rounds_figures(rounds, steady_from)
    names = list(fig["median"])
    med = fig["median"]
    lines = [f"{len(rounds)} rounds, order {order}: "
             + "; ".join(f"round {k + 1}: {', '.join(o)}" for k, o in enumerate(orders)) + ".",
             f"Steady IOPS of a round = the median of fio's per-second IOPS at t ≥ "
             f"{steady_from:.0f} s; a * marks a round with an error.", "",
             "| scenario | median of the rounds | min–max | (max − min) ÷ median | per round |",
             "|---|---|---|---|---|"]
    for n in names:
        vals = []
        for r, v in zip(rounds, fig["per_round"][n]):
            err = n in r and r[n].error
            vals.append("—" if math.isnan(v) else f"{v:,.0f}" + ("*" if err else ""))
        lo, hi, m = fig["min"][n], fig["max"][n], med[n]
        spread = (hi - lo) / m if m and not math.isnan(m) else float("nan")
        lines.append(f"| {LABELS.get(n, n)} | {m:,.0f} | {lo:,.0f}–{hi:,.0f} | {spread:.2f} | "
                     f"{' '.join(vals)} |")
    lines += ["", "Ratios of the medians (row ÷ column):", "",
              "| | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for n in names:
        cells = [f"{med[n] / med[m]:.3f}" if med[m] and not math.isnan(med[m] + med[n])
                 else "—" for m in names]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines += [""] + start_lines(rounds, steady_from, names) + [""]
    return "\n".join(lines), fig


def start_lines(rounds: list[dict[str, Result]], steady_from: float,
                names: list[str]) -> list[str]:
    """Per daemon, per round: its time to 90 % of that round's oracle (when the oracle
    ran) and the trace events lost."""
    out = []
    for n in (n for n in names if n in DAEMONS):
        t = [t90(r[n], r["oracle"].steady_median(steady_from)) if "oracle" in r and n in r
             else None for r in rounds]
        lost = [events_lost(r[n]) if n in r else None for r in rounds]
        out.append(f"- {LABELS.get(n, n)}, per round: "
                   + (("90 % of the oracle after " + ", ".join(
                       "never" if x is None else f"{x:.0f} s" for x in t) + "; ")
                      if any("oracle" in r for r in rounds) else "")
                   + "trace events lost " + ", ".join(str(x) for x in lost) + ".")
    return out
