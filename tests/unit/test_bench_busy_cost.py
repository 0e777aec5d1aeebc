"""bench_busy_cost: its scenarios by name, the table it writes, the profile's split."""

import cProfile

import pytest

from benchmarks.bench_busy_cost import profile_split, report, scenario

pytestmark = pytest.mark.repo     # the repository's files and tools: the same on every Python


def test_scenarios_by_name():
    assert scenario("nbd-3000") == {"kind": "nbd", "disks": 1, "rate": 3000}
    assert scenario("nbd-max") == {"kind": "nbd", "disks": 1, "rate": 0}
    assert scenario("three")["disks"] == 3 and scenario("flood")["kind"] == "flood"
    with pytest.raises(SystemExit, match="unknown scenario 'nbd-fast'"):
        scenario("nbd-fast")


def row(name, daemon, cpu, lost=0):
    return {"scenario": name, "daemon": daemon, "cpu": cpu, "events_per_s": 4000.0,
            "lost": lost, "rss_max": 50 << 20}


def test_the_table_gives_the_median_each_round_and_current_over_rev():
    rows = [row("nbd-max", "current", 1.0), row("nbd-max", "current", 3.0, lost=7),
            row("nbd-max", "@abc", 8.0), row("nbd-max", "@abc", 8.0)]
    text = report(rows, ["nbd-max"], "@abc", "abcdef0123456")
    line = next(x for x in text.splitlines() if x.startswith("| nbd-max"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:5] == ["nbd-max", "4,000", "**2.00** (1.00, 3.00)", "1.0", "7"]
    assert cells[-2:] == ["8.00 (8.00, 8.00)", "**0.250**"]
    assert "`@abc` (abcdef0123)" in text


def test_the_profile_split_adds_up_to_the_main_threads_time(tmp_path):
    out = tmp_path / "p.prof"
    cProfile.runctx("sum(i * i for i in range(200000))", {}, {}, str(out))
    split = dict(profile_split(str(out)))
    total = split.pop("the main thread, profiled")
    assert total > 0
    assert sum(split.values()) == pytest.approx(total)
    assert split["parsing the pages"] == 0.0
