"""--compare-rev of bench_host_budget and bench_host_cost: the twins, the side-by-side table."""

import pytest

from benchmarks.bench_host_budget import NAMES, compare_lines, round_orders, with_rev_twins
from benchmarks.bench_host_cost import compare_lines as cost_lines
from benchmarks.bench_host_cost import summary as host_cost_summary
from benchmarks.source_common import ratio_text, side_by_side

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python

SHA = "876a386307" + "0" * 30


def test_each_daemon_scenario_gets_its_rev_twin_next_to_it():
    names = with_rev_twins(["none", "oracle", "global", "split"])
    assert names == ["none", "oracle", "global", "global-rev", "split", "split-rev"]
    second = round_orders(names, 2)[1]          # reversed: B A on the second round
    assert second.index("global-rev") + 1 == second.index("global")


def test_side_by_side_gives_current_rev_and_their_ratio():
    lines = side_by_side("OLD", SHA, [("IOPS", 1200.0, 1000.0, ",.0f"),
                                      ("CPU", 1.0, 0.0, ".2f"),
                                      ("held", float("nan"), 5.0, lambda v: f"{v:g} B")], "how")
    assert lines[0].startswith("Side by side with `OLD` (876a386307): how")
    assert "| IOPS | 1,200 | 1,000 | **1.200** |" in lines
    assert "| CPU | 1.00 | 0.00 | **—** |" in lines
    assert "| held | — | 5 B | **—** |" in lines
    assert ratio_text(1.0, float("nan")) == "—"


def test_host_budget_compares_each_pair_and_the_target_ratios():
    names = with_rev_twins(["oracle", "global", "split"])
    results = []
    for rnd in (1, 2):
        for n, busy in (("oracle", 3000), ("global", 4000), ("global-rev", 2000),
                        ("split", 2000), ("split-rev", 2000)):
            per = dict.fromkeys(NAMES, 1000.0) | {"busy": float(busy * rnd)}
            results.append({"scenario": n, "round": rnd, "per_vm": per,
                            "total": sum(per.values()), "held_end": 1 << 30})
    text = "\n".join(compare_lines(results, names, 2, "OLD", SHA))
    assert "| global: total IOPS | 9,000 | 6,000 | **1.500** |" in text
    assert "| split: total IOPS | 6,000 | 6,000 | **1.000** |" in text
    assert "| global ÷ split (target ≥ 1.3) | 1.50 | 1.00 | **1.500** |" in text
    assert "| global ÷ oracle (target ≥ 1) | 1.20 | 0.80 | **1.500** |" in text
    assert "in each round: global 1.400, 1.571; split 1.000, 1.000." in text


def test_host_cost_compares_the_headline_figures():
    cur = {"cpu_quiet": 1.0, "cpu_busy": 3.0, "per_busy": 0.2, "iops": 9000.0,
           "rss_max": 400 << 20, "rss_disk": 4 << 20, "held_quiet": 1 << 30,
           "cycle_max": 0.08, "lost": 0}
    text = "\n".join(cost_lines(cur, dict(cur, cpu_quiet=2.0), "OLD", SHA, "how"))
    assert "| CPU, quiet window, % of a core | 1.00 | 2.00 | **0.500** |" in text
    assert "| the longest cycle | 80 ms | 80 ms | **1.000** |" in text
    assert "| memory besides held pages, a disk | 4M | 4M | **1.000** |" in text
    idle = "\n".join(cost_lines(dict(cur, cpu_busy=None), cur, "OLD", SHA, "how"))
    assert "busy window" not in idle


def test_host_cost_summary_takes_the_busy_disks_share_of_each_round():
    def run(quiet, busy):
        w = {"cpu": quiet, "rss_max": 300 << 20, "cycle_max": 0.1, "lost": 0,
             "held_median": 1 << 30}
        return {"quiet": w, "busy": dict(w, cpu=busy, iops=100.0, cycle_max=0.3, lost=2)}
    s = host_cost_summary([run(1.0, 3.0), run(1.2, 4.2)], busy=10, disks=100)
    assert s["per_busy"] == pytest.approx(0.25)        # the median of 0.2 and 0.3
    assert s["cycle_max"] == 0.3 and s["lost"] == 2
    assert s["rss_disk"] == 3 << 20
